"""bench.merge_rewrites against a real broker process (local store or SeaweedFS, embedded
metadata): a short trial produces every message, reads the CPU and disk writes of the
broker (and of the S3 server), and finds this tree's merged-bytes counter. Every process
is stopped by its PID."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.merge_rewrites import trial


@pytest.mark.parametrize("store", ["local", "s3"])
def test_a_short_trial_measures_the_broker(tmp_path: Path, store: str) -> None:
    args = argparse.Namespace(partitions=8, rate=400.0, seconds=3.0, layout="default", store=store)
    r = trial(None, args, tmp_path / "b")
    assert r["mb_s"] > 0 and r["p99_ms"] > 0
    assert r["cpu_ms_mb"] > 0
    assert r["written_per_byte"] >= 0
    assert (r["store_cpu_ms_mb"] > 0) == (store == "s3")  # SeaweedFS took the PUTs
    # this tree exports kafscale_maintenance_merged_bytes_total (a base tree may not)
    assert r["merged_per_byte"] is not None and r["merged_per_byte"] >= 0
    assert r["merges_per_mb"] is not None and r["merges_per_mb"] >= 0
