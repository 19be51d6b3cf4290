"""bench.commit_chunks on the embedded store: both modes commit every chunk, guarded."""

from __future__ import annotations

from pathlib import Path

from bench.commit_chunks import measure
from broker.meta.embedded import EmbeddedStore
from broker.meta.schema import end_key, segments_prefix


async def test_both_modes_commit_every_chunk(tmp_path: Path) -> None:
    store = EmbeddedStore(str(tmp_path), prefix="/bench")
    try:
        times = await measure(store, 130, 3)  # three chunks: 64, 64 and 2 partitions
        assert {k: len(v) for k, v in times.items()} == {"one by one": 3, "together": 3}
        for p in (0, 64, 129):  # six phases, each one entry and one end per partition
            assert len(await store.range(segments_prefix("bench", p))) == 6
            kv = await store.get(end_key("bench", p))
            assert kv is not None and kv.value == b"6"
    finally:
        await store.close()
