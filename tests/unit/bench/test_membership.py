"""``bench.membership``'s figures: which records count for an event, and what is reported
of them."""

from __future__ import annotations

import math

import pytest

from bench.membership import SLOW_MS, Deliveries, figures


def test_an_event_counts_the_records_produced_from_it_until_the_next() -> None:
    out = Deliveries()
    out.rows += [(0, 1.0, 1.01), (1, 2.0, 2.5), (0, 2.9, 3.0), (1, 3.0, 3.2)]
    got = out.between(2.0, 3.0)
    assert [p for p, _ in got] == [1, 0]
    assert [ms for _, ms in got] == pytest.approx([500.0, 100.0])


def test_the_figures_of_an_event() -> None:
    rows = [(p, 10.0) for p in range(4) for _ in range(50)] + [(2, SLOW_MS + 1), (3, 900.0)]
    f = figures(rows)
    assert f["max"] == 900.0
    assert f["p99"] == 10.0  # 2 of 202 records are slow: the 99th percentile is not
    assert f["slow"] == 2.0  # partitions 2 and 3
    assert f["records"] == 202.0


def test_no_records_is_not_a_figure() -> None:
    f = figures([])
    assert math.isnan(f["max"]) and math.isnan(f["p99"]) and f["records"] == 0.0
