"""bench.cycle_keys on the embedded store: both brokers acknowledge every cycle, and the
one with cycle keys commits each in one transaction."""

from __future__ import annotations

from pathlib import Path

from bench.cycle_keys import measure, open_side


async def test_cycle_keys_commit_a_wide_cycle_in_one_transaction(tmp_path: Path) -> None:
    sides = [
        await open_side(name, tmp_path / name, "embedded", f"/{name}", name == "cycles")
        for name in ("per-partition", "cycles")
    ]
    try:
        got = await measure(sides, 70, 3)  # per partition: two chunks (64 + 6)
    finally:
        for s in sides:
            await s.broker.stop()
    assert got["per-partition"] == (2.0, 2.0)
    all_txns, ack = got["cycles"]
    assert ack == 1.0 and all_txns > 1.0  # the fold and the deletion come on top
    assert all(len(s.acked) == 3 for s in sides)
