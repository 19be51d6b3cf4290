"""broker/reads.py over a real LocalStore and real segments: a fetch read crosses the
windows of a large segment (and from its last window into the next segment) while they
are cached, instead of answering a short fetch at every window boundary, and still waits
for one load at most (docs/benchmarks.md, Round 4: cold reads)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

import broker.reads
from broker.meta.schema import SegmentMeta
from broker.partition import PartitionLog
from broker.reads import Reader
from broker.segment_windows import window_key
from protocol.batch import iter_batches
from segments.cache import SegmentCache
from tests.unit.broker.counting_store import CountingStore
from tests.unit.segments.conftest import make_segment

WINDOW = 6000  # ~5 batches of ~1.2 KB per window
NS = "ns"


def _offsets(views: list[memoryview]) -> list[int]:
    return [hdr.base_offset for v in views for hdr, _ in iter_batches(v)]


async def _setup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, readahead: int
) -> tuple[Reader, PartitionLog, CountingStore, SegmentCache]:
    """A large segment (offsets 100-299: 40 batches of 5 records, read by windows) and a
    small one after it (300-304), as a restarted broker finds them: only in the store."""
    monkeypatch.setattr(broker.reads, "WHOLE_READ_LIMIT", 10_000)  # 40 batches: windows
    store, cache = CountingStore(str(tmp_path)), SegmentCache(1 << 30)
    segs = []
    for name, base, sizes in (("big", 100, [5] * 40), ("small", 300, [5])):
        built, data = make_segment(base, sizes, index_interval=5, value_size=200)
        etag = await store.put_if_absent(f"{NS}/t/0/{name}", built.buffers)
        last = base + sum(sizes) - 1
        segs.append(SegmentMeta(base, last, len(data), sum(sizes), -1, etag, name))
    assert segs[0].size > 10_000 >= segs[1].size
    lg = PartitionLog("t", 0, uuid.uuid4(), 1, b"o", 1, 305, segs, [(1, 100)])
    config = SimpleNamespace(namespace=NS, readahead_bytes=readahead)
    logs = SimpleNamespace(config=config, store=store, cache=cache)
    reader = Reader(logs)  # type: ignore[arg-type]
    reader.windows.window = WINDOW
    return reader, lg, store, cache


async def _settle(reader: Reader) -> None:
    while reader.loader._loading:  # noqa: SLF001 - readaheads still running
        await asyncio.wait(list(reader.loader._loading.values()))  # noqa: SLF001


async def test_a_read_crosses_cached_windows_up_to_its_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader, lg, store, _cache = await _setup(tmp_path, monkeypatch, 1 << 30)
    first = await reader.read(lg, 100, 3 * WINDOW)  # a miss: its window alone
    assert _offsets(first)[0] == 100
    await _settle(reader)  # the readahead has loaded every window and the small segment
    gets = len(store.gets)
    views = await reader.read(lg, 100, 3 * WINDOW)
    got = _offsets(views)
    assert got == list(range(100, got[-1] + 1, 5))  # contiguous, from the offset on
    total = sum(len(v) for v in views)
    assert len(views) >= 3 and 2 * WINDOW < total <= 3 * WINDOW  # not cut at a window end
    # to the end: the rest of the big segment's windows and then the small segment
    views = await reader.read(lg, got[-1] + 5, 1 << 20)
    assert _offsets(views) == list(range(got[-1] + 5, 301, 5))
    assert len(store.gets) == gets  # all from the cache


async def test_a_read_waits_for_one_load_at_most(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no readahead, a read from a cold large segment loads the window holding its
    offset and stops at that window's end, budget left or not."""
    reader, lg, store, cache = await _setup(tmp_path, monkeypatch, 0)
    views = await reader.read(lg, 100, 1 << 20)
    layout = reader.windows.layout(reader.object_key(lg, lg.segments[0]), lg.segments[0])
    assert layout is not None and len(layout.bounds) > 3
    b = layout.bounds
    assert sum(len(v) for v in views) == b[1] - b[0]  # the first window, whole
    windows = set(layout.windows_from(0))
    assert [(lo, hi) for _k, lo, hi in store.gets if (lo, hi) in windows] == [(b[0], b[1])]
    assert cache.get(window_key(f"{NS}/t/0/big", b[1])) is None  # the next: not loaded
