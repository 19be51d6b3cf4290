from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from protocol.batch import iter_batches, verify_crc
from segments.format import (
    FOOTER_SIZE,
    HEADER_SIZE,
    BuiltSegment,
    IndexEntry,
    body_end,
    parse_index,
)
from segments.local_store import LocalStore
from segments.reader import (
    MIN_READ,
    TAIL_READ,
    find_offset_for_timestamp,
    load_index,
    read_from,
    scan_batch_headers,
    slice_batches,
)
from segments.store import PreconditionFailedError
from tests.unit.segments.conftest import BASE_TS, make_segment


class RecordingStore(LocalStore):
    """A real LocalStore that also records the byte ranges it was asked for."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.ranges: list[tuple[int | None, int | None]] = []

    async def get(
        self,
        key: str,
        start: int | None = None,
        end: int | None = None,
        if_match: str | None = None,
    ) -> bytes:
        self.ranges.append((start, end))
        return await super().get(key, start, end, if_match)


def offsets_of(view: memoryview) -> list[tuple[int, int]]:
    out = []
    for hdr, batch in iter_batches(view):
        assert verify_crc(batch, hdr)
        out.append((hdr.base_offset, hdr.last_offset))
    return out


@pytest.fixture(params=[1, 2], ids=["v1-index-object", "v2-index-trailer"])
def version(request: pytest.FixtureRequest) -> int:
    """Every reader test runs on both layouts (docs/format.md)."""
    return int(request.param)


async def stored(
    tmp_path: Path, version: int, sizes: Sequence[int], **kw: int
) -> tuple[RecordingStore, str, BuiltSegment, bytes]:
    store = RecordingStore(str(tmp_path))
    built, data = make_segment(100, sizes, version=version, **kw)
    etag = await store.put_if_absent("t/0/seg.kfs", built.buffers)
    if version == 1:
        await store.put_if_absent("t/0/seg.index", [built.index])
    return store, etag, built, data


async def rf(
    store: RecordingStore,
    index: list[IndexEntry] | None,
    offset: int,
    max_bytes: int,
    data: bytes,
    etag: str,
) -> memoryview:
    """``read_from`` on the stored segment, told its trailer's length as a reader is."""
    trailer = len(data) - FOOTER_SIZE - body_end(data)
    return await read_from(store, "t/0/seg.kfs", index, offset, max_bytes, len(data), etag, trailer)


async def test_load_index_reads_either_layout(tmp_path: Path, version: int) -> None:
    store, etag, built, data = await stored(tmp_path, version, [5, 1, 7, 3], index_interval=5)
    store.ranges.clear()
    index, trailer = await load_index(store, "t/0/seg.kfs", len(data), etag)
    assert index == parse_index(built.index) and len(index) == 3
    assert trailer == (len(built.index) if version == 2 else 0)
    # the header and the tail at once (v2: the trailer is in the tail; v1: then the whole
    # index object beside it); the tail is the last 64 KiB at most
    tail = (max(HEADER_SIZE, len(data) - TAIL_READ), len(data))
    assert sorted(store.ranges[:2], key=str) == sorted([(0, HEADER_SIZE), tail], key=str)
    assert store.ranges[2:] == ([] if version == 2 else [(None, None)])


class BufferStore(RecordingStore):
    """A store with a read-path GET (``get_buffer``, as S3's direct GETs), which records
    its ranges apart from ``get``'s."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.buffer_ranges: list[tuple[int | None, int | None]] = []

    async def get_buffer(
        self,
        key: str,
        start: int | None = None,
        end: int | None = None,
        if_match: str | None = None,
    ) -> memoryview:
        self.buffer_ranges.append((start, end))
        return memoryview(await LocalStore.get(self, key, start, end, if_match)).toreadonly()


@pytest.mark.parametrize("sizes", [[5, 1, 7, 3], [1] * 7000], ids=["tail", "huge-trailer"])
async def test_load_index_reads_the_segment_by_get_buffer(
    tmp_path: Path, version: int, sizes: list[int]
) -> None:
    """The segment's ranges go through the read path's GET (S3: a direct GET, not the
    SDK's); only a version 1 segment's ``.index`` object is read by ``get``."""
    store = BufferStore(str(tmp_path))
    built, data = make_segment(
        100, sizes, version=version, index_interval=5 if len(sizes) < 9 else 1, value_size=1
    )
    etag = await store.put_if_absent("t/0/seg.kfs", built.buffers)
    if version == 1:
        await store.put_if_absent("t/0/seg.index", [built.index])
    index, trailer = await load_index(store, "t/0/seg.kfs", len(data), etag)
    assert index == parse_index(built.index)
    assert trailer == (len(built.index) if version == 2 else 0)
    tail = (max(HEADER_SIZE, len(data) - TAIL_READ), len(data))
    assert sorted(store.buffer_ranges[:2], key=str) == sorted([(0, HEADER_SIZE), tail], key=str)
    huge = version == 2 and len(built.index) > TAIL_READ
    assert store.buffer_ranges[2:] == ([(body_end(data), len(data) - FOOTER_SIZE)] if huge else [])
    assert store.ranges == ([] if version == 2 else [(None, None)])


async def test_load_index_of_a_huge_trailer_reads_its_range(tmp_path: Path, version: int) -> None:
    """An index longer than the tail read with the header: its exact range is read."""
    store, etag, built, data = await stored(
        tmp_path, version, [1] * 7000, index_interval=1, value_size=1
    )
    assert len(built.index) > TAIL_READ
    store.ranges.clear()
    index, trailer = await load_index(store, "t/0/seg.kfs", len(data), etag)
    assert index == parse_index(built.index) and len(index) == 7000
    if version == 2:
        assert trailer == len(built.index)
        assert store.ranges[2:] == [(body_end(data), len(data) - FOOTER_SIZE)]


async def test_every_offset_returns_the_containing_batch_first(
    tmp_path: Path, version: int
) -> None:
    store, etag, built, data = await stored(tmp_path, version, [5, 1, 7, 3], index_interval=5)
    index = parse_index(built.index)
    bounds = [(100, 104), (105, 105), (106, 112), (113, 115)]
    for offset in range(95, 117):
        got = await rf(store, index, offset, 1 << 20, data, etag)
        want = [b for b in bounds if b[1] >= offset]
        assert offsets_of(got) == want, offset
        assert bytes(got) == bytes(slice_batches(data, index, offset, 1 << 20))
        assert offsets_of(slice_batches(data, None, offset, 1 << 20)) == want


async def test_max_bytes_whole_batches_only(tmp_path: Path, version: int) -> None:
    store, etag, built, data = await stored(tmp_path, version, [10, 10, 10, 10])
    sizes = [len(b) for _, b in iter_batches(memoryview(data)[HEADER_SIZE : body_end(data)])]
    one = await rf(store, None, 100, 1, data, etag)
    assert offsets_of(one) == [(100, 109)]  # at least one batch even over max_bytes
    two_and_half = sizes[0] + sizes[1] + sizes[2] // 2
    got = await rf(store, None, 100, two_and_half, data, etag)
    assert offsets_of(got) == [(100, 109), (110, 119)]
    exact = await rf(store, None, 110, sizes[1] + sizes[2], data, etag)
    assert offsets_of(exact) == [(110, 119), (120, 129)]
    assert offsets_of(slice_batches(data, None, 110, sizes[1] + sizes[2])) == [
        (110, 119),
        (120, 129),
    ]


async def test_past_the_end_is_empty(tmp_path: Path, version: int) -> None:
    store, etag, _, data = await stored(tmp_path, version, [3])
    assert len(await rf(store, None, 103, 1000, data, etag)) == 0
    assert len(slice_batches(data, None, 500, 1000)) == 0


async def test_index_positions_the_first_range_get(tmp_path: Path, version: int) -> None:
    store, etag, built, data = await stored(tmp_path, version, [50] * 6, index_interval=100)
    index = parse_index(built.index)
    assert len(index) == 3
    store.ranges.clear()
    got = await rf(store, index, 310, 1, data, etag)
    assert offsets_of(got) == [(300, 349)]
    assert store.ranges[0][0] == index[2].position
    assert all(start is not None and start >= HEADER_SIZE for start, _ in store.ranges)


async def test_batch_larger_than_first_read(tmp_path: Path, version: int) -> None:
    # ~120 KiB batches: the first GET (MIN_READ) holds only part of the wanted batch
    store, etag, built, data = await stored(tmp_path, version, [120, 120, 120], value_size=1000)
    assert len(data) > 3 * MIN_READ
    for offset, want in ((100, (100, 219)), (250, (220, 339)), (400, (340, 459))):
        store.ranges.clear()
        got = await rf(store, None, offset, 1, data, etag)
        assert offsets_of(got) == [want]
        assert len(store.ranges) >= 2


async def test_if_match_mismatch(tmp_path: Path, version: int) -> None:
    store, _, _, data = await stored(tmp_path, version, [3])
    with pytest.raises(PreconditionFailedError):
        await rf(store, None, 100, 100, data, "0" * 32)


async def test_scan_headers_and_timestamp_lookup(tmp_path: Path, version: int) -> None:
    store, etag, _, _ = await stored(tmp_path, version, [4, 4, 4])
    batches = await scan_batch_headers(store, "t/0/seg.kfs", etag)
    assert [(b.header.base_offset, b.header.record_count) for b in batches] == [
        (100, 4),
        (104, 4),
        (108, 4),
    ]
    assert batches[0].position == HEADER_SIZE
    # batch starting at offset o has timestamps BASE_TS + o .. BASE_TS + o + 3
    assert find_offset_for_timestamp(batches, BASE_TS + 105) == 104
    assert find_offset_for_timestamp(batches, 0) == 100
    assert find_offset_for_timestamp(batches, BASE_TS + 10_000) is None
