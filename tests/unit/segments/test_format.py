from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.batch import crc32c, read_header
from segments.format import (
    FOOTER_MAGIC,
    FOOTER_SIZE,
    HEADER_SIZE,
    INDEX_HEADER_SIZE,
    SEGMENT_MAGIC,
    SEGMENT_VERSION,
    CorruptSegmentError,
    IndexEntry,
    base_offset_of_key,
    body_end,
    index_key,
    index_key_for,
    index_trailer_length,
    iter_segment_batches,
    lookup,
    parse_footer,
    parse_header,
    parse_index,
    partition_prefix,
    segment_index,
    segment_key,
)
from segments.validate import validate_segment
from segments.writer import build_segment
from tests.unit.segments.conftest import BASE_TS, make_batches, make_segment


def test_keys() -> None:
    assert partition_prefix("default", "orders", 3) == "default/orders/3/"
    k = segment_key("default", "orders", 3, 42)
    assert k == "default/orders/3/segment-00000000000000000042.kfs"
    assert index_key("ns", "t", 0, 7) == "ns/t/0/segment-00000000000000000007.index"
    assert index_key_for(k) == "default/orders/3/segment-00000000000000000042.index"
    assert base_offset_of_key(k) == 42
    with pytest.raises(ValueError):
        base_offset_of_key("default/orders/3/other.kfs")


@pytest.mark.parametrize("version", [1, 2])
def test_round_trip_layout(version: int) -> None:
    built, data = make_segment(1000, [5, 3, 7], version=version)
    assert len(data) == built.size
    assert (built.base_offset, built.last_offset, built.record_count) == (1000, 1014, 15)
    assert built.max_timestamp == BASE_TS + 1008 + 6
    hdr = parse_header(data)
    assert hdr.magic == SEGMENT_MAGIC and hdr.version == version
    assert (hdr.base_offset, hdr.record_count, hdr.created_ms) == (1000, 15, BASE_TS)
    trailer = len(built.index) if version == 2 else 0
    assert hdr.index_length == trailer and body_end(data) == len(data) - FOOTER_SIZE - trailer
    ftr = parse_footer(data)
    assert ftr.magic == FOOTER_MAGIC and ftr.last_offset == 1014
    assert ftr.body_crc == crc32c(data[HEADER_SIZE : body_end(data)])
    offsets = [(h.base_offset, h.last_offset) for _, h, _ in iter_segment_batches(data)]
    assert offsets == [(1000, 1004), (1005, 1007), (1008, 1014)]
    # version 2 carries its index inside; version 1 has none there (it is an object beside)
    assert segment_index(data) == (parse_index(built.index) if version == 2 else None)
    report = validate_segment(data, None if version == 2 else built.index)
    assert report.ok, report.problems
    assert report.index == parse_index(built.index)
    assert [b.crc_ok for b in report.batches] == [True, True, True]


def test_v2_is_the_v1_object_with_its_index_inside() -> None:
    """The layouts differ only in the header's version and index length and the trailer:
    the body and the footer are the same bytes."""
    v1, d1 = make_segment(7, [4, 9], version=1)
    v2, d2 = make_segment(7, [4, 9])
    assert v1.index == v2.index and len(d2) == len(d1) + len(v1.index)
    assert d1[6:28] == d2[6:28] and d1[HEADER_SIZE:-FOOTER_SIZE] == d2[HEADER_SIZE : body_end(d2)]
    assert d2[body_end(d2) : -FOOTER_SIZE] == v1.index and d1[-FOOTER_SIZE:] == d2[-FOOTER_SIZE:]
    assert struct.unpack_from(">HH", d1, 4)[0] == 1 and struct.unpack_from(">I", d1, 28)[0] == 0
    assert index_trailer_length(d2[:HEADER_SIZE], len(d2)) == len(v1.index)
    assert index_trailer_length(d1[:HEADER_SIZE], len(d1)) == 0


def test_v2_trailer_damage_is_reported() -> None:
    built, data = make_segment(0, [60, 60, 60], index_interval=50)
    start = body_end(data)
    assert "index magic" in _problems(_flip(data, start + 1))
    moved = bytearray(data)
    pos = struct.unpack_from(">I", moved, start + INDEX_HEADER_SIZE + 12 + 8)[0]
    struct.pack_into(">I", moved, start + INDEX_HEADER_SIZE + 12 + 8, pos + 1)
    assert "does not point at the start" in _problems(bytes(moved))
    # a trailer length past the object, or a version 2 header that announces none
    too_long = bytearray(data)
    struct.pack_into(">I", too_long, 28, len(data))
    assert "does not fit" in _problems(bytes(too_long))
    with pytest.raises(CorruptSegmentError, match="does not fit"):
        list(iter_segment_batches(bytes(too_long)))
    no_trailer = bytearray(data[:start] + data[-FOOTER_SIZE:])
    struct.pack_into(">I", no_trailer, 28, 0)
    assert "without its index trailer" in _problems(bytes(no_trailer))
    # the trailer is not part of the body: a damaged trailer leaves the body CRC intact
    assert "body CRC" not in _problems(_flip(data, start + 1))


def test_batches_are_not_copied() -> None:
    batches = make_batches(0, [2, 2])
    views = [memoryview(b) for b in batches]
    built = build_segment(0, views)
    assert built.buffers[1] is views[0] and built.buffers[2] is views[1]
    assert len(built.buffers) == 5 and built.buffers[3] == built.index  # header .. trailer, footer
    legacy = build_segment(0, views, version=1)
    assert len(legacy.buffers) == 4
    # the version it reports is the one in its header (the commit records it)
    assert (built.version, legacy.version) == (SEGMENT_VERSION, 1)
    assert [parse_header(b.buffers[0]).version for b in (built, legacy)] == [SEGMENT_VERSION, 1]


def test_dominant_compression_flag() -> None:
    built, data = make_segment(0, [50, 1], compression=1)  # gzip
    assert built.compression == 1
    assert parse_header(data).compression == 1
    assert validate_segment(data, built.index).ok


def test_index_every_interval_records() -> None:
    built, data = make_segment(0, [40] * 10, index_interval=100)
    entries = parse_index(built.index)
    # first batch always; then a batch boundary once >= 100 records passed since the last
    assert [e.offset for e in entries] == [0, 120, 240, 360]
    positions = {pos: h.base_offset for pos, h, _ in iter_segment_batches(data)}
    assert all(positions[e.position] == e.offset for e in entries)
    assert struct.unpack_from(">I", built.index, 10)[0] == 100


def test_lookup() -> None:
    index = [IndexEntry(10, 32), IndexEntry(120, 500), IndexEntry(240, 900)]
    assert lookup(index, 5) is None
    assert lookup(index, 10) == index[0]
    assert lookup(index, 119) == index[0]
    assert lookup(index, 120) == index[1]
    assert lookup(index, 10_000) == index[2]
    assert lookup([], 3) is None


def test_build_rejects_gaps_and_bad_start() -> None:
    a, b = make_batches(0, [3, 3])
    gap = make_batches(7, [1])[0]
    with pytest.raises(ValueError, match="expected 3"):
        build_segment(0, [memoryview(a), memoryview(gap)])
    with pytest.raises(ValueError, match="expected 5"):
        build_segment(5, [memoryview(a), memoryview(b)])
    with pytest.raises(ValueError, match="at least one"):
        build_segment(0, [])
    with pytest.raises(ValueError, match="exactly one"):
        build_segment(0, [memoryview(a + b)])


def _flip(data: bytes, pos: int) -> bytes:
    buf = bytearray(data)
    buf[pos] ^= 0xFF
    return bytes(buf)


def _problems(data: bytes, index: bytes | None = None) -> str:
    report = validate_segment(data, index)
    assert not report.ok
    with pytest.raises(CorruptSegmentError):
        report.raise_if_corrupt()
    return " | ".join(report.problems)


def test_corrupt_header_magic_and_version() -> None:
    _, data = make_segment(0, [3])
    assert "header magic" in _problems(_flip(data, 0))
    assert "version" in _problems(_flip(data, 5))


def test_corrupt_header_record_count() -> None:
    _, data = make_segment(0, [3, 4])
    assert "header record count" in _problems(_flip(data, 19))


def test_corrupt_body_record_bytes() -> None:
    _, data = make_segment(0, [3, 4])
    msg = _problems(_flip(data, body_end(data) - 5))  # inside the last batch
    assert "body CRC-32C mismatch" in msg
    assert "fails its CRC-32C" in msg


def test_corrupt_batch_offset_keeps_batch_crc() -> None:
    built, data = make_segment(0, [3, 4])
    second = HEADER_SIZE + read_header(data, HEADER_SIZE).size
    buf = bytearray(data)
    struct.pack_into(">q", buf, second, 99)  # baseOffset is outside the batch CRC
    msg = _problems(bytes(buf))
    assert "base offset 99, expected 3" in msg and "body CRC-32C" in msg


def test_corrupt_footer() -> None:
    _, data = make_segment(0, [3])
    assert "footer magic" in _problems(_flip(data, len(data) - 1))
    assert "body CRC-32C mismatch" in _problems(_flip(data, len(data) - 16))
    assert "footer last offset" in _problems(_flip(data, len(data) - 5))


@pytest.mark.parametrize("version", [1, 2])
def test_truncated_segments(version: int) -> None:
    _, data = make_segment(0, [3, 4], version=version)
    assert "less than header + footer" in _problems(data[:40])
    msg = _problems(data[:-30])  # cuts into the last batch and loses the footer
    assert "footer magic" in msg
    assert "past the end of the body" in msg or "truncated batch header" in msg


def test_corrupt_index() -> None:  # a version 1 segment's separate index object
    built, data = make_segment(0, [60, 60, 60], index_interval=50, version=1)
    idx = built.index
    assert "index magic" in _problems(data, _flip(idx, 1))
    assert "does not match" in _problems(data, idx[:-1])
    moved = bytearray(idx)
    pos = struct.unpack_from(">I", moved, INDEX_HEADER_SIZE + 12 + 8)[0]
    struct.pack_into(">I", moved, INDEX_HEADER_SIZE + 12 + 8, pos + 1)
    assert "does not point at the start" in _problems(data, bytes(moved))


def test_parse_errors_raise() -> None:
    with pytest.raises(CorruptSegmentError, match="truncated"):
        parse_header(b"KAFS")
    with pytest.raises(CorruptSegmentError, match="footer magic"):
        parse_footer(b"\0" * 16)
    with pytest.raises(CorruptSegmentError, match="index header truncated"):
        parse_index(b"\0\0")


@settings(max_examples=25, deadline=None)
@given(
    base=st.integers(min_value=0, max_value=2**40),
    sizes=st.lists(st.integers(min_value=1, max_value=30), min_size=1, max_size=12),
    interval=st.integers(min_value=1, max_value=50),
)
def test_round_trip_property(base: int, sizes: list[int], interval: int) -> None:
    built, data = make_segment(base, sizes, index_interval=interval)
    report = validate_segment(data)  # the index is the trailer's
    assert report.ok, report.problems
    assert report.footer is not None and report.footer.last_offset == base + sum(sizes) - 1
    assert report.index is not None and report.index[0].offset == base
    # every gap between index entries is at most interval + one batch of records
    offsets = [e.offset for e in report.index] + [base + sum(sizes)]
    assert all(b - a <= interval + max(sizes) for a, b in zip(offsets, offsets[1:], strict=False))
