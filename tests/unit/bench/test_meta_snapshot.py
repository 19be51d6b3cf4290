"""bench.meta_snapshot on an embedded store: every snapshot is timed, and the writer's
puts are counted between snapshots (and, as they overlap them, during)."""

from __future__ import annotations

from pathlib import Path

from bench.meta_snapshot import WARM_PUTS, _line, measure
from broker.meta.embedded import EmbeddedStore


async def test_every_snapshot_is_timed_and_the_puts_are_counted(tmp_path: Path) -> None:
    res = await measure(tmp_path, 300, 16, 2)
    assert len(res["snapshot_ms"]) == 2 and all(ms > 0 for ms in res["snapshot_ms"])
    assert len(res["between_ms"]) >= 3 * WARM_PUTS  # before, and after each snapshot
    assert "puts while one is written" in _line("this", res)
    store = EmbeddedStore(str(tmp_path))  # what the bench wrote is a store
    try:
        assert len(await store.range("/fill/")) == 300
    finally:
        await store.close()
