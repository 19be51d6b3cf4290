"""bench.stats: the percentile every bench reports."""

from __future__ import annotations

import math

from bench.stats import percentile


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.50) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile([7.0], 0.99) == 7.0
    assert math.isnan(percentile([], 0.5))
    assert percentile([1.0, 2.0], 1.0) == 2.0  # the maximum
    assert percentile([1.0, 2.0], 0.0) == 1.0  # the minimum
