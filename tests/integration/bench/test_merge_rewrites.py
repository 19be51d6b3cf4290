"""bench.merge_rewrites against a real broker process (local store, embedded metadata): a
short trial produces every message, reads the broker's CPU and disk writes, and finds
this tree's merged-bytes counter. The broker is stopped by its PID."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.merge_rewrites import trial


def test_a_short_trial_measures_the_broker(tmp_path: Path) -> None:
    args = argparse.Namespace(partitions=8, rate=400.0, seconds=3.0, layout="default")
    r = trial(None, args, tmp_path / "b")
    assert r["mb_s"] > 0 and r["p99_ms"] > 0
    assert r["cpu_ms_mb"] > 0
    assert r["written_per_byte"] >= 0
    # this tree exports kafscale_maintenance_merged_bytes_total (a base tree may not)
    assert r["merged_per_byte"] is not None and r["merged_per_byte"] >= 0
