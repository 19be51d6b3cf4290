"""bench.scrape_stall against a real broker process (local store, embedded metadata): a
short trial probes the broker's event loop idle and while /metrics is scraped, and the
scrape carries the lagged group's series. The broker is stopped by its PID."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.scrape_stall import trial


def test_a_short_trial_probes_the_loop_idle_and_while_scraped(tmp_path: Path) -> None:
    args = argparse.Namespace(lag_partitions=40, scrapes=3)
    r = trial(None, args, tmp_path / "b")
    for window in ("idle", "scraped"):
        assert r[f"{window}_probes"] > 0  # the probe's round trips were answered
        assert 0 < r[f"{window}_p50_ms"] <= r[f"{window}_p99_ms"] <= r[f"{window}_max_ms"]
    assert r["scraped_scrape_ms"] > 0
    assert r["lines"] > 2 * 40  # a lag and a committed-offset series per partition, and more
