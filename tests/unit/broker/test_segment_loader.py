"""broker/segment_loader.py over a real LocalStore: shared loads, parallel ranged GETs,
readahead into the cache."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from broker.meta.schema import SegmentMeta
from broker.segment_loader import (
    PART,
    READAHEAD_BYTES,
    Piece,
    SegmentLoader,
    ranges,
    sparse_index,
)
from segments.cache import SegmentCache
from segments.format import HEADER_SIZE, IndexEntry, iter_segment_batches
from segments.local_store import LocalStore
from segments.reader import slice_batches
from segments.store import ObjectNotFoundError, PreconditionFailedError
from tests.unit.broker.counting_store import CountingStore
from tests.unit.segments.conftest import make_segment


async def _segment(store: LocalStore, key: str, size: int) -> tuple[bytes, SegmentMeta]:
    data = os.urandom(size)
    etag = await store.put_if_absent(key, [data])
    return data, SegmentMeta(0, 0, size, 1, -1, etag, key)


def _loader(store: LocalStore, cache: SegmentCache) -> SegmentLoader:
    return SegmentLoader(lambda: store, lambda: cache)


async def test_concurrent_readers_share_one_get(tmp_path: Path) -> None:
    store, cache = CountingStore(str(tmp_path), ranged=False), SegmentCache(1 << 30)
    data, seg = await _segment(store, "t/0/a", 100_000)
    loader = _loader(store, cache)
    got = await asyncio.gather(*(loader.load("t/0/a", seg) for _ in range(5)))
    assert all(g == data for g in got)
    assert store.gets == [("t/0/a", None, None)]
    cached = cache.get("t/0/a", seg.etag)
    assert cached is not None and cached.data == data


async def test_large_segments_come_as_parallel_ranged_gets(tmp_path: Path) -> None:
    store, cache = CountingStore(str(tmp_path), ranged=True), SegmentCache(1 << 30)
    size = 2 * PART + 12_345
    data, seg = await _segment(store, "t/0/big", size)
    assert await _loader(store, cache).load("t/0/big", seg) == data
    assert sorted(store.gets) == [
        ("t/0/big", lo, min(lo + PART, size)) for lo in (0, PART, 2 * PART)
    ]
    # a manifest size that does not match the object: one whole GET instead
    store.gets.clear()
    wrong = SegmentMeta(0, 0, size + 1, 1, -1, seg.etag, "t/0/big")
    assert await _loader(store, SegmentCache(1 << 30)).load("t/0/big", wrong) == data
    assert store.gets[-1] == ("t/0/big", None, None)


async def test_if_match_and_missing_objects_reach_the_reader(tmp_path: Path) -> None:
    store, cache = CountingStore(str(tmp_path), ranged=True), SegmentCache(1 << 30)
    _data, seg = await _segment(store, "t/0/a", 3 * PART)
    other = SegmentMeta(0, 0, seg.size, 1, -1, "crc32c-00000000-1", "t/0/a")
    with pytest.raises(PreconditionFailedError):
        await _loader(store, cache).load("t/0/a", other)
    gone = SegmentMeta(0, 0, 10, 1, -1, "", "t/0/gone")
    with pytest.raises(ObjectNotFoundError):
        await _loader(store, cache).load("t/0/gone", gone)
    assert cache.get("t/0/a") is None and cache.get("t/0/gone") is None


async def _settle(loader: SegmentLoader) -> None:
    while loader._loading:  # noqa: SLF001 - wait for the background loads to finish
        await asyncio.wait(list(loader._loading.values()))  # noqa: SLF001


async def test_readahead_fills_the_cache_and_drops_failures(tmp_path: Path) -> None:
    store, cache = CountingStore(str(tmp_path), ranged=False), SegmentCache(1 << 30)
    segs = [await _segment(store, f"t/0/s{i}", 50_000) for i in range(4)]
    missing = SegmentMeta(0, 0, 10, 1, -1, "", "t/0/missing")
    loader = SegmentLoader(lambda: store, lambda: cache, readahead_bytes=100_010)
    pieces = [Piece.whole("t/0/missing", missing)] + [Piece.whole(s.key, s) for _d, s in segs]
    assert loader.readahead(pieces) == 3  # 10 + 50,000 + 50,000 bytes fit the budget
    await _settle(loader)
    assert cache.get("t/0/missing") is None  # failed: dropped
    for data, seg in segs[:2]:
        cached = cache.get(seg.key, seg.etag)
        assert cached is not None and cached.data == data
    assert cache.get(segs[2][1].key) is None and cache.get(segs[3][1].key) is None
    # what is cached already counts as ahead: the budget moves on by the cached bytes
    store.gets.clear()
    assert loader.readahead([Piece.whole(s.key, s) for _d, s in segs[1:]]) == 1
    await _settle(loader)
    assert store.gets == [(segs[2][1].key, None, None)]


async def test_readahead_takes_one_piece_larger_than_its_budget(tmp_path: Path) -> None:
    store, cache = CountingStore(str(tmp_path), ranged=False), SegmentCache(1 << 30)
    segs = [await _segment(store, f"t/0/s{i}", 50_000) for i in range(2)]
    loader = SegmentLoader(lambda: store, lambda: cache, readahead_bytes=1000)
    assert loader.readahead([Piece.whole(s.key, s) for _d, s in segs]) == 1
    await _settle(loader)
    assert store.gets == [(segs[0][1].key, None, None)]


def test_readahead_budget_is_a_share_of_the_cache() -> None:
    small = SegmentCache(30 * 1024 * 1024)
    loader = SegmentLoader(lambda: None, lambda: small)  # type: ignore[arg-type,return-value]
    assert loader.budget() == 10 * 1024 * 1024  # a third of the cache, below the default
    big = SegmentCache(1 << 30)
    loader = SegmentLoader(lambda: None, lambda: big)  # type: ignore[arg-type,return-value]
    assert loader.budget() == READAHEAD_BYTES


def test_ranges_cover_the_span_in_parts() -> None:
    assert ranges(0, 10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert ranges(100, 108, 4) == [(100, 104), (104, 108)]
    assert ranges(5, 5, 4) == []


async def test_a_piece_is_a_ranged_get_cached_under_its_own_key(tmp_path: Path) -> None:
    store, cache = CountingStore(str(tmp_path), ranged=True), SegmentCache(1 << 30)
    size = 3 * PART
    data, seg = await _segment(store, "t/0/big", size)
    piece = Piece("t/0/big#7", "t/0/big", seg, 7, 7 + PART + 10)
    assert await _loader(store, cache).load_piece(piece) == data[7 : 7 + PART + 10]
    assert sorted(store.gets) == [("t/0/big", 7, 7 + PART), ("t/0/big", 7 + PART, 7 + PART + 10)]
    cached = cache.get("t/0/big#7", seg.etag)
    assert cached is not None and cached.data == data[7 : 7 + PART + 10]
    assert cache.get("t/0/big") is None


async def test_no_readahead_with_a_budget_of_zero(tmp_path: Path) -> None:
    store, cache = CountingStore(str(tmp_path), ranged=False), SegmentCache(1 << 30)
    _data, seg = await _segment(store, "t/0/s0", 1000)
    loader = SegmentLoader(lambda: store, lambda: cache, readahead_bytes=0)
    assert loader.readahead([Piece.whole(seg.key, seg)]) == 0
    assert not loader._loading and store.gets == []  # noqa: SLF001


def test_sparse_index_of_a_loaded_segment() -> None:
    built, data = make_segment(100, [5] * 40, index_interval=5, value_size=200)
    starts = {pos: hdr.base_offset for pos, hdr, _ in iter_segment_batches(data)}
    index = sparse_index(data, every=5000)
    assert index is not None and index[0] == IndexEntry(100, HEADER_SIZE)
    assert all(starts[e.position] == e.offset for e in index)  # real batch starts
    gaps = [b.position - a.position for a, b in zip(index, index[1:], strict=False)]
    assert gaps and all(g >= 5000 for g in gaps) and len(index) < len(starts)
    for offset in range(100, 300):  # the same batches as a walk from the start
        assert slice_batches(data, index, offset, 3000) == slice_batches(data, None, offset, 3000)
    assert sparse_index(os.urandom(5000)) is None  # bad framing: no index


async def test_a_loaded_segment_is_cached_with_its_index(tmp_path: Path) -> None:
    store, cache = CountingStore(str(tmp_path), ranged=False), SegmentCache(1 << 30)
    built, data = make_segment(100, [5] * 40, index_interval=5, value_size=200)
    etag = await store.put_if_absent("t/0/seg", built.buffers)
    seg = SegmentMeta(100, 299, len(data), 200, -1, etag, "t/0/seg")
    assert await _loader(store, cache).load("t/0/seg", seg) == data
    cached = cache.get("t/0/seg", etag)
    assert cached is not None and cached.index == sparse_index(data)
