"""KAFS segment and sparse-index format (docs/format.md): constants, records and parsers
(the writer is ``segments.writer``, the validator ``segments.validate``).

Segment object (big-endian)::

    header 32: magic "KAFS" u32 | version u16 | flags u16 (bits 0-2: dominant compression,
               bit 3: compacted)
               | base offset i64 | record count i32 | created unix ms i64
               | index length u32 (version 2; version 1: reserved, 0)
    body   n : Kafka v2 RecordBatches, byte-for-byte
    index  m : version 2 only: the sparse index (the index object's bytes, below), m = the
               header's index length
    footer 16: CRC-32C of the body u32 | last offset i64 | magic "END!" u32

Version 2 (written since "one object per flush cycle", docs/format.md) carries its index
inside the object; version 1 segments (still read) have it in a separate ``.index``
object beside them. ``body_end`` says where the body ends in either.

Index object (version 1) / index trailer (version 2)::

    header 16: magic "\\0IDX" u32 | version u16 | entry count u32 | interval (records) u32
               | reserved u16
    entries  : offset i64 | byte position of the batch start in the segment file u32

"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Iterator, Sequence

from protocol.batch import (
    BATCH_HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    read_header,
)
from protocol.crc32c_combine import IMPLEMENTATION as _COMBINE_IMPLEMENTATION
from protocol.values import value
from segments.names import (  # the key and object-name helpers, re-exported
    DEFAULT_NAMESPACE,
    INDEX_SUFFIX,
    SEGMENT_SUFFIX,
    ObjectName,
    base_offset_of_key,
    index_key,
    index_key_for,
    object_name,
    parse_object_name,
    partition_prefix,
    segment_key,
    topic_tag,
)
from segments.store import Buffer

__all__ = [
    "DEFAULT_NAMESPACE",
    "INDEX_SUFFIX",
    "SEGMENT_SUFFIX",
    "ObjectName",
    "base_offset_of_key",
    "index_key",
    "index_key_for",
    "object_name",
    "parse_object_name",
    "partition_prefix",
    "segment_key",
    "topic_tag",
]

SEGMENT_MAGIC = 0x4B414653  # "KAFS"
FOOTER_MAGIC = 0x454E4421  # "END!"
INDEX_MAGIC = 0x00494458  # "\0IDX"
SEGMENT_VERSION = 2  # what build_segment writes: the index travels inside the object
LEGACY_SEGMENT_VERSION = 1  # index in a separate ``.index`` object (still read)
SEGMENT_VERSIONS = (LEGACY_SEGMENT_VERSION, SEGMENT_VERSION)
INDEX_VERSION = 1
HEADER_SIZE = 32
FOOTER_SIZE = 16
INDEX_HEADER_SIZE = 16
INDEX_ENTRY_SIZE = 12
DEFAULT_INDEX_INTERVAL = 100
# batches at least this large get their body CRC combined from their verified CRC
# (``build_segment``'s ``batch_crcs``); smaller ones are hashed: below this, hashing them
# costs less than the combination (C: ~0.5 us a batch; pure Python: ~5 us)
COMBINE_MIN = 16 << 10 if _COMBINE_IMPLEMENTATION == "c" else 256 << 10
COMPRESSION_FLAG_MASK = 0x07
# bit 3: written by log compaction: batches ascend with gaps between them, the body may
# hold no batch, the footer's last offset may lie past the last batch (docs/format.md)
COMPACTED_FLAG = 0x08

_HEADER = struct.Struct(">IHHqiqI")
_FOOTER = struct.Struct(">IqI")
_INDEX_HEADER = struct.Struct(">IHIIH")
_INDEX_ENTRY = struct.Struct(">qI")

assert _HEADER.size == HEADER_SIZE
assert _FOOTER.size == FOOTER_SIZE
assert _INDEX_HEADER.size == INDEX_HEADER_SIZE
assert _INDEX_ENTRY.size == INDEX_ENTRY_SIZE


class CorruptSegmentError(ValueError):
    """A segment or index object that does not match the KAFS format."""


# ---------------------------------------------------------------------------- values


@value
class SegmentHeader:
    magic: int
    version: int
    flags: int
    base_offset: int
    record_count: int
    created_ms: int
    reserved: int = 0  # version 2: the length of the index trailer

    @property
    def index_length(self) -> int:
        """Bytes of the index trailer between body and footer (0 in version 1)."""
        return self.reserved if self.version >= SEGMENT_VERSION else 0

    @property
    def compression(self) -> int:
        return self.flags & COMPRESSION_FLAG_MASK

    @property
    def compacted(self) -> bool:
        return bool(self.flags & COMPACTED_FLAG)


@value
class SegmentFooter:
    body_crc: int
    last_offset: int
    magic: int


@value
class IndexEntry:
    offset: int
    position: int


@value
class BuiltSegment:
    # header, the batch views themselves (zero-copy), the index trailer (version 2), footer
    buffers: list[Buffer]
    index: bytes  # the sparse index (inside the object in version 2, beside it in 1)
    # the same index as entries (``parse_index(index)``), for the segment cache: a flush
    # or a merge caches what it built without parsing the bytes it just packed
    entries: list[IndexEntry]
    base_offset: int
    last_offset: int
    record_count: int
    size: int
    max_timestamp: int
    compression: int
    # the CRC-32C of the whole object (header to footer), for the store's ETag / checksum
    # (``ObjectStore.put_if_absent``'s ``crc32c``); 0 when not computed
    crc32c: int = 0
    version: int = SEGMENT_VERSION  # the format version it was built in


# ---------------------------------------------------------------------------- parsers


def parse_header(data: Buffer) -> SegmentHeader:
    """Parse and check the 32-byte header at the start of ``data``."""
    if len(data) < HEADER_SIZE:
        raise CorruptSegmentError(f"segment header truncated: {len(data)} bytes < {HEADER_SIZE}")
    hdr = SegmentHeader(*_HEADER.unpack_from(data, 0))
    if hdr.magic != SEGMENT_MAGIC:
        raise CorruptSegmentError(f"bad segment header magic 0x{hdr.magic:08X} (want KAFS)")
    if hdr.version not in SEGMENT_VERSIONS:
        raise CorruptSegmentError(f"unsupported segment version {hdr.version}")
    return hdr


def index_trailer_length(header: Buffer, size: int) -> int:
    """The index trailer's length from a segment's first ``HEADER_SIZE`` bytes (0 for a
    version 1 segment), checked against the object's ``size``."""
    trailer = parse_header(header).index_length
    if trailer > size - HEADER_SIZE - FOOTER_SIZE:
        raise CorruptSegmentError(
            f"index trailer of {trailer} bytes does not fit a {size}-byte segment"
        )
    return trailer


def body_end(data: Buffer) -> int:
    """Where the body of a whole segment ends: the footer (version 1) or the index trailer
    (version 2 and later). Raises CorruptSegmentError when the trailer cannot fit."""
    n = len(data)
    if n < HEADER_SIZE:
        return n - FOOTER_SIZE
    _magic, version, _f, _b, _r, _c, trailer = _HEADER.unpack_from(data, 0)
    if version < SEGMENT_VERSION:
        return n - FOOTER_SIZE
    if trailer > n - HEADER_SIZE - FOOTER_SIZE:
        raise CorruptSegmentError(f"index trailer of {trailer} bytes does not fit {n} bytes")
    return n - FOOTER_SIZE - trailer


def index_trailer(data: Buffer) -> memoryview | None:
    """The index bytes inside a whole version 2 segment (None for version 1)."""
    end = body_end(data)
    if end == len(data) - FOOTER_SIZE:
        return None
    return memoryview(data)[end : len(data) - FOOTER_SIZE]


def segment_index(data: Buffer) -> list[IndexEntry] | None:
    """The parsed index trailer of a whole segment (None for version 1)."""
    trailer = index_trailer(data)
    return None if trailer is None else parse_index(trailer)


def parse_footer(data: Buffer) -> SegmentFooter:
    """Parse and check the 16-byte footer at the end of ``data`` (a segment or a footer)."""
    if len(data) < FOOTER_SIZE:
        raise CorruptSegmentError(f"segment footer truncated: {len(data)} bytes < {FOOTER_SIZE}")
    ftr = SegmentFooter(*_FOOTER.unpack_from(data, len(data) - FOOTER_SIZE))
    if ftr.magic != FOOTER_MAGIC:
        raise CorruptSegmentError(f"bad segment footer magic 0x{ftr.magic:08X} (want END!)")
    return ftr


def parse_index_header(data: Buffer) -> tuple[int, int]:
    """Check an index object's header and length; return (entry count, interval)."""
    if len(data) < INDEX_HEADER_SIZE:
        raise CorruptSegmentError(f"index header truncated: {len(data)} bytes")
    magic, version, count, interval, _ = _INDEX_HEADER.unpack_from(data, 0)
    if magic != INDEX_MAGIC:
        raise CorruptSegmentError(f"bad index magic 0x{magic:08X} (want IDX)")
    if version != INDEX_VERSION:
        raise CorruptSegmentError(f"unsupported index version {version}")
    want = INDEX_HEADER_SIZE + count * INDEX_ENTRY_SIZE
    if len(data) != want:
        raise CorruptSegmentError(
            f"index length {len(data)} does not match {count} entries ({want} bytes)"
        )
    return count, interval


def parse_index(data: Buffer) -> list[IndexEntry]:
    """Parse an index object into entries (ascending offsets are checked)."""
    count, _ = parse_index_header(data)
    entries = [
        IndexEntry(*_INDEX_ENTRY.unpack_from(data, INDEX_HEADER_SIZE + i * INDEX_ENTRY_SIZE))
        for i in range(count)
    ]
    for prev, cur in zip(entries, entries[1:], strict=False):
        if cur.offset <= prev.offset or cur.position <= prev.position:
            raise CorruptSegmentError(f"index entries not ascending at offset {cur.offset}")
    return entries


def lookup(index: Sequence[IndexEntry], offset: int) -> IndexEntry | None:
    """The last index entry at or before ``offset`` (None if ``offset`` precedes them all)."""
    i = bisect_right(index, offset, key=lambda e: e.offset)
    return index[i - 1] if i else None


def iter_segment_batches(data: Buffer) -> Iterator[tuple[int, BatchHeader, memoryview]]:
    """Yield (position in the segment, header, batch view) for each batch of the body.

    Raises CorruptSegmentError when a batch is truncated or framed badly.
    """
    view = memoryview(data)
    end = body_end(view)
    pos = HEADER_SIZE
    while pos < end:
        if end - pos < BATCH_HEADER_SIZE:
            raise CorruptSegmentError(f"truncated batch header at byte {pos}")
        hdr = read_header(view, pos)
        if hdr.magic != 2:
            raise CorruptSegmentError(f"batch at byte {pos} has magic {hdr.magic}, want 2")
        if hdr.size < BATCH_HEADER_SIZE or pos + hdr.size > end:
            raise CorruptSegmentError(
                f"batch at byte {pos} has length {hdr.size} past the end of the body ({end})"
            )
        yield pos, hdr, view[pos : pos + hdr.size]
        pos += hdr.size


# a batch's baseOffset, batchLength and magic ("x" skips the partition leader epoch)
_BATCH_FRAME = struct.Struct(">qi4xb")


def iter_batch_frames(data: Buffer) -> Iterator[tuple[int, int, memoryview]]:
    """Yield (position in the segment, base offset, batch view) for each batch of the
    body: ``iter_segment_batches`` without a ``BatchHeader`` per batch, for the walks
    that read nothing else (merges, the segment cache's sparse index). The same checks,
    the same CorruptSegmentError messages."""
    view = memoryview(data)
    end = body_end(view)
    unpack = _BATCH_FRAME.unpack_from
    pos = HEADER_SIZE
    while pos < end:
        if end - pos < BATCH_HEADER_SIZE:
            raise CorruptSegmentError(f"truncated batch header at byte {pos}")
        first, length, magic = unpack(view, pos)
        if magic != 2:
            raise CorruptSegmentError(f"batch at byte {pos} has magic {magic}, want 2")
        size = length + LOG_OVERHEAD
        if size < BATCH_HEADER_SIZE or pos + size > end:
            raise CorruptSegmentError(
                f"batch at byte {pos} has length {size} past the end of the body ({end})"
            )
        yield pos, first, view[pos : pos + size]
        pos += size
