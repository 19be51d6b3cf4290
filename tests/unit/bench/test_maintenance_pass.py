"""bench.maintenance_pass on an in-process broker: the partitions get their segments, and
after the first pass no idle partition is looked at again for merges."""

from __future__ import annotations

from pathlib import Path

from bench.maintenance_pass import measure


async def test_idle_partitions_are_not_looked_at_again(tmp_path: Path) -> None:
    res = await measure(tmp_path, 12, 3, 4)
    assert res["segments"] == 3  # too young to merge: every committed segment stays
    assert len(res["pass_ms"]) == 4 and all(ms >= 0 for ms in res["pass_ms"])
    assert res["looks_per_pass"] == 0
