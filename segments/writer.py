"""The KAFS segment writer (docs/format.md): ``build_segment`` frames offset-patched v2
record batches as one segment object with its sparse index, without copying the
batches, and ``build_index`` packs an index. The format's constants, records and
parsers are ``segments.format``.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from protocol.batch import BATCH_HEADER_SIZE, COMPRESSION_MASK, CRC_START, LOG_OVERHEAD, crc32c
from protocol.crc32c_combine import crc32c_combine
from segments.format import (
    _FOOTER,
    _HEADER,
    _INDEX_ENTRY,
    _INDEX_HEADER,
    COMBINE_MIN,
    COMPACTED_FLAG,
    DEFAULT_INDEX_INTERVAL,
    FOOTER_MAGIC,
    FOOTER_SIZE,
    HEADER_SIZE,
    INDEX_ENTRY_SIZE,
    INDEX_HEADER_SIZE,
    INDEX_MAGIC,
    INDEX_VERSION,
    SEGMENT_MAGIC,
    SEGMENT_VERSION,
    SEGMENT_VERSIONS,
    BuiltSegment,
    IndexEntry,
)
from segments.store import Buffer

# a batch header's fields as ``_frame`` reads them ("x" skips a byte: the partition leader
# epoch, the base timestamp, the producer id, epoch and base sequence are not read)
_BATCH_HEADER = struct.Struct(">qi4xbIhi8xq8x2x4xi")


def _dominant_compression(weights: dict[int, int]) -> int:
    """The codec of most bytes (the lowest on a tie); 0 for none."""
    if len(weights) <= 1:
        return next(iter(weights), 0)
    return max(sorted(weights), key=lambda codec: weights[codec])


def build_index(entries: Sequence[IndexEntry], interval: int) -> bytes:
    out = bytearray(INDEX_HEADER_SIZE + INDEX_ENTRY_SIZE * len(entries))
    _INDEX_HEADER.pack_into(out, 0, INDEX_MAGIC, INDEX_VERSION, len(entries), interval, 0)
    pos = INDEX_HEADER_SIZE
    for entry in entries:
        _INDEX_ENTRY.pack_into(out, pos, entry.offset, entry.position)
        pos += INDEX_ENTRY_SIZE
    return bytes(out)


@dataclass(slots=True)
class _Body:
    """What ``build_segment`` learns from its batches in one walk."""

    crc: int = 0  # CRC-32C of the body
    end: int = HEADER_SIZE  # where the body ends in the segment
    records: int = 0
    max_timestamp: int = -1
    next_offset: int = 0
    entries: list[IndexEntry] = field(default_factory=list)
    weights: dict[int, int] = field(default_factory=dict)  # codec -> bytes


def _frame(
    base_offset: int,
    batches: Sequence[memoryview],
    index_interval: int,
    compacted: bool,
    batch_crcs: Sequence[int] | None,
) -> _Body:
    """Check the batches' framing and offsets, index them and CRC the body (combined
    from ``batch_crcs`` for batches of at least ``COMBINE_MIN`` bytes).

    The headers are unpacked as tuples, not ``BatchHeader`` objects: this runs for every
    batch of every flush (docs/benchmarks.md, "Round 16")."""
    if batch_crcs is not None and len(batch_crcs) != len(batches):
        raise ValueError(f"{len(batch_crcs)} batch CRCs for {len(batches)} batches")
    unpack = _BATCH_HEADER.unpack_from
    entries: list[IndexEntry] = []
    weights: dict[int, int] = {}
    crc = records = 0
    max_ts = -1
    end = HEADER_SIZE
    expected = base_offset
    since_index = 0
    for i, view in enumerate(batches):
        if len(view) < BATCH_HEADER_SIZE:
            raise ValueError(f"batch {i} is not exactly one v2 record batch")
        # baseOffset, batchLength, magic, crc, attributes, lastOffsetDelta, maxTimestamp,
        # recordCount (protocol.batch._HDR, the fields not needed here skipped)
        first, length, magic, stored, attrs, delta, ts, count = unpack(view)
        size = length + LOG_OVERHEAD
        if magic != 2 or size != len(view):
            raise ValueError(f"batch {i} is not exactly one v2 record batch")
        if first < expected if compacted else first != expected:
            raise ValueError(
                f"batch {i} has base offset {first}, expected {expected} (not contiguous)"
            )
        if i == 0 or since_index >= index_interval:
            entries.append(IndexEntry(first, end))
            since_index = 0
        if batch_crcs is not None and size >= COMBINE_MIN:
            if batch_crcs[i] != stored:
                raise ValueError(f"batch {i}: the CRC given is not the batch's stored CRC")
            prefix = crc32c(view[:CRC_START], crc)  # baseOffset .. crc: patched here
            crc = crc32c_combine(prefix, stored, size - CRC_START)
        else:
            crc = crc32c(view, crc)
        records += count
        since_index += count
        codec = attrs & COMPRESSION_MASK
        weights[codec] = weights.get(codec, 0) + size
        if ts > max_ts:
            max_ts = ts
        end += size
        expected = first + delta + 1
    return _Body(crc, end, records, max_ts, expected, entries, weights)


def build_segment(
    base_offset: int,
    batches: Sequence[memoryview],
    created_ms: int | None = None,
    index_interval: int = DEFAULT_INDEX_INTERVAL,
    *,
    compacted_last: int | None = None,
    version: int = SEGMENT_VERSION,
    batch_crcs: Sequence[int] | None = None,
) -> BuiltSegment:
    """Frame offset-patched v2 batches as a segment + index without copying the batches.

    ``version`` 2 (the default) puts the index inside the object as a trailer, one object
    to write; version 1 (old readers, tests) leaves it to be written beside the segment.

    Raises ValueError when there are no batches, a batch is not framed as one v2 batch, or
    the batches' offsets are not contiguous from ``base_offset``. ``compacted_last``
    builds a compacted segment instead (docs/format.md, "Compacted segments"): batches
    ascending within ``[base_offset, compacted_last]`` with gaps, possibly none at all.

    The footer's body CRC is the CRC-32C of the batches' bytes. ``batch_crcs`` (one per
    batch: the CRC-32C of its bytes from ``attributes`` to its end) lets it be combined
    from those instead of hashing the batches again (docs/benchmarks.md, "Round 4: CRC
    passes"): pass ONLY CRCs this process verified against the batch's bytes (produce
    validation) or computed over them itself, from bytes unchanged since (the broker's
    patch of baseOffset/batchLength/partitionLeaderEpoch is outside them and is hashed
    here). A CRC that differs from the batch's stored CRC field raises ValueError.
    Batches read back from the store (merges, compaction, repair) carry no such proof and
    are hashed. ``BuiltSegment.crc32c`` is the whole object's CRC-32C either way.
    """
    compacted = compacted_last is not None
    if not batches and not compacted:
        raise ValueError("a segment needs at least one record batch")
    if index_interval <= 0:
        raise ValueError("index_interval must be positive")
    if version not in SEGMENT_VERSIONS:
        raise ValueError(f"unsupported segment version {version}")
    body = _frame(base_offset, batches, index_interval, compacted, batch_crcs)
    last_offset = body.next_offset - 1
    compression = _dominant_compression(body.weights)
    flags = compression
    if compacted_last is not None:
        if compacted_last < last_offset:
            raise ValueError(f"batches end at {last_offset}, past {compacted_last}")
        last_offset = compacted_last
        flags |= COMPACTED_FLAG
    created = int(time.time() * 1000) if created_ms is None else created_ms
    index = build_index(body.entries, index_interval)
    trailer = len(index) if version >= SEGMENT_VERSION else 0
    header = _HEADER.pack(
        SEGMENT_MAGIC, version, flags, base_offset, body.records, created, trailer
    )
    footer = _FOOTER.pack(body.crc, last_offset, FOOTER_MAGIC)
    buffers: list[Buffer] = (
        [header, *batches, index, footer] if trailer else [header, *batches, footer]
    )
    whole = crc32c_combine(crc32c(header), body.crc, body.end - HEADER_SIZE)
    whole = crc32c(footer, crc32c(index, whole) if trailer else whole)
    return BuiltSegment(
        buffers=buffers,
        index=index,
        entries=body.entries,
        base_offset=base_offset,
        last_offset=last_offset,
        record_count=body.records,
        size=body.end + trailer + FOOTER_SIZE,
        max_timestamp=body.max_timestamp,
        compression=compression,
        crc32c=whole,
        version=version,
    )
