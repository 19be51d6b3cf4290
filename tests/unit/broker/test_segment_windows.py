"""broker/segment_windows.py over a real LocalStore and real segments: large segments
read as windows of whole batches, each fetched once, read ahead."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.meta.schema import SegmentMeta
from broker.segment_loader import Piece, SegmentLoader
from broker.segment_windows import Windows, make_layout, slice_window, window_key
from protocol.batch import iter_batches
from segments.cache import SegmentCache
from segments.format import (
    FOOTER_SIZE,
    HEADER_SIZE,
    CorruptSegmentError,
    IndexEntry,
    index_trailer_length,
    parse_index,
)
from tests.unit.broker.counting_store import CountingStore
from tests.unit.segments.conftest import make_segment

BATCHES = [5] * 40  # 40 batches of 5 records, ~1.2 KB each, every batch indexed
WINDOW = 6000


def _trailer(data: bytes) -> int:
    """The index trailer's length (format version 2; 0 for version 1)."""
    return index_trailer_length(data[:HEADER_SIZE], len(data))


def _offsets(view: memoryview) -> list[int]:
    return [hdr.base_offset for hdr, _ in iter_batches(view)]


async def _setup(tmp_path: Path, readahead: int = 1 << 30):
    store, cache = CountingStore(str(tmp_path)), SegmentCache(1 << 30)
    built, data = make_segment(100, BATCHES, index_interval=5, value_size=200)
    etag = await store.put_if_absent("t/0/big", built.buffers)
    seg = SegmentMeta(100, 299, len(data), 200, -1, etag, "t/0/big")
    loader = SegmentLoader(lambda: store, lambda: cache, readahead_bytes=readahead)
    windows = Windows(loader, lambda: cache)
    windows.window = WINDOW
    layout = windows.remember("t/0/big", seg, parse_index(built.index), _trailer(data))
    return store, cache, loader, windows, seg, layout, data


@pytest.mark.parametrize("version", [1, 2])
def test_windows_start_at_batches_and_hold_whole_ones(version: int) -> None:
    """Windows cover the body and nothing else: a version 2 segment's index trailer, which
    sits between the body and the footer, is in none of them."""
    built, data = make_segment(100, BATCHES, index_interval=5, value_size=200, version=version)
    trailer = _trailer(data)
    assert (trailer > 0) == (version == 2)
    layout = make_layout(parse_index(built.index), len(data), "e", WINDOW, trailer)
    assert layout.bounds[0] == HEADER_SIZE
    assert layout.end == len(data) - FOOTER_SIZE - trailer
    assert len(layout.bounds) > 3
    starts = {e.position for e in parse_index(built.index)}
    seen: list[int] = []
    for lo, hi in layout.windows_from(0):
        assert lo in starts | {HEADER_SIZE}
        assert hi - lo >= WINDOW or hi == layout.end  # only the last may be shorter
        seen += _offsets(memoryview(data)[lo:hi])  # raises on a cut batch
    assert seen == list(range(100, 300, 5))
    assert list(layout.windows_from(layout.end)) == []


def test_slice_window_rejects_bad_framing_and_misses_past_its_end() -> None:
    built, data = make_segment(100, BATCHES, index_interval=5, value_size=200)
    layout = make_layout(parse_index(built.index), len(data), "e", WINDOW, _trailer(data))
    lo, hi = layout.bounds[0], layout.bounds[1]
    window = data[lo:hi]
    assert len(slice_window(window, lo, lo, 10_000, 1 << 20)) == 0  # not in this window
    assert _offsets(slice_window(window, lo, lo, 107, 1)) == [105]  # one batch at least
    with pytest.raises(CorruptSegmentError):
        slice_window(window[:-3], lo, lo, 10_000, 1 << 20)


async def test_a_sequential_reader_gets_every_batch_and_each_window_once(
    tmp_path: Path,
) -> None:
    store, cache, loader, windows, seg, layout, _ = await _setup(tmp_path)
    offset, got = 100, []
    while offset <= seg.last:
        view = (await windows.read_to("t/0/big", seg, layout, offset, 3000, lambda: iter(())))[0]
        assert len(view)
        got += _offsets(view)
        offset = got[-1] + 5
    assert got == list(range(100, 300, 5))
    while loader._loading:  # noqa: SLF001 - readaheads still running
        await asyncio.wait(list(loader._loading.values()))  # noqa: SLF001
    expected = [("t/0/big", lo, hi) for lo, hi in layout.windows_from(0)]
    assert sorted(store.gets) == sorted(expected)  # ranged, each window once, no whole GET
    assert (await windows.read_to("t/0/big", seg, layout, 300, 3000, lambda: iter(())))[0] == b""


async def test_readahead_loads_the_next_windows_then_the_following_pieces(
    tmp_path: Path,
) -> None:
    store, cache, loader, windows, seg, layout, data = await _setup(tmp_path, 2 * WINDOW + 100)
    tail = (await store.put_if_absent("t/0/next", [b"x" * 10])), "t/0/next"
    nxt = SegmentMeta(300, 300, 10, 1, -1, tail[0], "t/0/next")
    view = (
        await windows.read_to(
            "t/0/big", seg, layout, 100, 100, lambda: iter([Piece.whole("t/0/next", nxt)])
        )
    )[0]
    assert _offsets(view) == [100]
    while loader._loading:  # noqa: SLF001
        await asyncio.wait(list(loader._loading.values()))  # noqa: SLF001
    b = layout.bounds
    assert cache.get(window_key("t/0/big", b[1])) is not None  # within the budget
    assert cache.get(window_key("t/0/big", b[2])) is None  # beyond it
    # from the last window on, the readahead continues into the following segment
    last = layout.bounds[-1]
    off = next(hdr.base_offset for hdr, _ in iter_batches(memoryview(data)[last : layout.end]))
    (
        await windows.read_to(
            "t/0/big", seg, layout, off, 100, lambda: iter([Piece.whole("t/0/next", nxt)])
        )
    )[0]
    while loader._loading:  # noqa: SLF001
        await asyncio.wait(list(loader._loading.values()))  # noqa: SLF001
    assert cache.get("t/0/next") is not None


async def test_every_read_tops_up_the_readahead(tmp_path: Path) -> None:
    """Readahead follows the reader: a later read from the same window loads again a
    window ahead that was evicted before the reader got there."""
    store, cache, loader, windows, seg, layout, _ = await _setup(tmp_path, WINDOW + 100)
    ahead = window_key("t/0/big", layout.bounds[1])

    async def read(offset: int) -> None:
        assert len(
            (await windows.read_to("t/0/big", seg, layout, offset, 100, lambda: iter(())))[0]
        )
        while loader._loading:  # noqa: SLF001
            await asyncio.wait(list(loader._loading.values()))  # noqa: SLF001

    await read(100)
    assert cache.get(ahead) is not None
    assert cache.evict(ahead)
    await read(105)  # the same window again
    assert cache.get(ahead) is not None
    assert store.gets.count(("t/0/big", layout.bounds[1], layout.bounds[2])) == 2


async def test_a_replaced_object_is_not_read_through_an_old_layout(tmp_path: Path) -> None:
    _store, _cache, _loader, windows, seg, _layout, _ = await _setup(tmp_path)
    assert windows.layout("t/0/big", seg) is not None
    other = SegmentMeta(seg.base, seg.last, seg.size, 200, -1, "other-etag", "t/0/big")
    assert windows.layout("t/0/big", other) is None


async def test_prepare_reads_a_layout_in_the_background_once(tmp_path: Path) -> None:
    store, _cache, loader, _w, seg, _layout, _ = await _setup(tmp_path)
    windows = Windows(loader, lambda: SegmentCache(1 << 30))
    windows.window = WINDOW
    built, data = make_segment(100, BATCHES, index_interval=5, value_size=200)
    calls = 0

    async def index() -> tuple[list[IndexEntry], int]:
        nonlocal calls
        calls += 1
        return parse_index(built.index), _trailer(data)

    assert windows.layout("t/0/big", seg) is None
    windows.prepare("t/0/big", seg, index)
    windows.prepare("t/0/big", seg, index)  # already under way: not again
    while windows._preparing:  # noqa: SLF001 - wait for the background read
        await asyncio.wait(list(windows._preparing.values()))  # noqa: SLF001
    layout = windows.layout("t/0/big", seg)
    assert calls == 1 and layout is not None and len(layout.bounds) > 3
    assert [p.cache_key for p in windows.pieces("t/0/big", seg, 0)][:2] == [
        window_key("t/0/big", layout.bounds[0]),
        window_key("t/0/big", layout.bounds[1]),
    ]
    windows.prepare("t/0/big", seg, index)  # known now: nothing to do
    assert calls == 1 and not windows._preparing  # noqa: SLF001

    async def failing() -> tuple[list[IndexEntry], int]:
        raise OSError("index unavailable")

    other = SegmentMeta(300, 400, seg.size, 1, -1, seg.etag, "t/0/other")
    windows.prepare("t/0/other", other, failing)
    while windows._preparing:  # noqa: SLF001
        await asyncio.wait(list(windows._preparing.values()))  # noqa: SLF001
    assert windows.layout("t/0/other", other) is None  # dropped, no layout
