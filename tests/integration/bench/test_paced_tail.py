"""bench.paced_tail against a real broker process (local store, embedded metadata): a
short paced trial delivers every message and reports its latencies and the broker's
CPU. The broker is stopped by its PID."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.paced_tail import trial


def test_a_short_paced_trial_measures_the_broker(tmp_path: Path) -> None:
    args = argparse.Namespace(rate=300.0, seconds=2.0, idempotent=True, broker_arg=[])
    r = trial(None, args, tmp_path / "b")
    assert 0 < r["p50_ms"] <= r["p99_ms"] <= r["max_ms"]
    assert r["cpu_ms_mb"] > 0
    assert 0 <= r["stalls_20"] <= r["stalls"]
