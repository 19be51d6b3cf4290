"""Kafka v2 RecordBatch header view: parse, CRC-32C check, in-place offset/epoch patch.

The 61-byte header (all big-endian):

    baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8 |
    crc uint32 | attributes int16 | lastOffsetDelta int32 | baseTimestamp int64 |
    maxTimestamp int64 | producerId int64 | producerEpoch int16 | baseSequence int32 |
    recordsCount int32

The CRC covers everything from ``attributes`` to the end of the batch, so the broker may
rewrite ``baseOffset`` and ``partitionLeaderEpoch`` without touching it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import crc32c as _crc32c

from protocol.values import value

BATCH_HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: bytes not counted in batchLength
CRC_START = 21  # offset of attributes: the CRC covers [21, end)
_HDR = struct.Struct(">qiibIhiqqqhii")
_Q = struct.Struct(">q")
_I = struct.Struct(">i")

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20


class CorruptBatchError(ValueError):
    """A record batch that cannot be framed or whose header is invalid."""


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC-32C (Castagnoli), optionally continuing from a previous value."""
    return _crc32c.crc32c(data, value)


@value
class BatchHeader:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Total bytes of the batch, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        return 1 if self.attributes & TIMESTAMP_TYPE_MASK else 0

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)


def read_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Parse the header of the batch starting at ``pos``. Raises CorruptBatchError."""
    if len(buf) - pos < BATCH_HEADER_SIZE:
        raise CorruptBatchError("truncated record batch header")
    return BatchHeader(*_HDR.unpack_from(buf, pos))


def iter_batches(buf: memoryview) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Split a records buffer into (header, batch view) pairs without copying.

    Raises CorruptBatchError on a truncated batch, a length below the header size, or a
    magic other than 2.
    """
    pos = 0
    end = len(buf)
    while pos < end:
        hdr = read_header(buf, pos)
        if hdr.magic != 2:
            raise CorruptBatchError(f"unsupported record batch magic {hdr.magic}")
        size = hdr.size
        if size < BATCH_HEADER_SIZE or pos + size > end:
            raise CorruptBatchError("record batch length out of bounds")
        yield hdr, buf[pos : pos + size]
        pos += size


_LENGTH = struct.Struct(">i")  # batchLength, at offset 8
_ATTRIBUTES = struct.Struct(">h")  # attributes, at CRC_START
_MAGIC_AT = 16


def any_transactional(buf: bytes | bytearray | memoryview) -> bool | None:
    """Whether any batch of ``buf`` is transactional, from each batch's length, magic
    and attributes only, with no header object built; None where ``iter_batches`` would
    raise (broken framing anywhere). Asked of every produced partition, where nearly
    every batch is not (docs/benchmarks.md, "Round 14")."""
    pos, end, found = 0, len(buf), False
    while pos < end:
        if end - pos < BATCH_HEADER_SIZE or buf[pos + _MAGIC_AT] != 2:
            return None
        size = _LENGTH.unpack_from(buf, pos + 8)[0] + LOG_OVERHEAD
        if size < BATCH_HEADER_SIZE or pos + size > end:
            return None
        found = found or bool(_ATTRIBUTES.unpack_from(buf, pos + CRC_START)[0] & TRANSACTIONAL_MASK)
        pos += size
    return found


def verify_crc(batch: bytes | bytearray | memoryview, header: BatchHeader | None = None) -> bool:
    """True when the batch's stored CRC-32C matches its bytes."""
    hdr = header or read_header(batch)
    return crc32c(memoryview(batch)[CRC_START : hdr.size]) == hdr.crc


def set_base_offset(batch: memoryview | bytearray, offset: int) -> None:
    """Patch baseOffset in place (not covered by the CRC)."""
    _Q.pack_into(batch, 0, offset)


def set_leader_epoch(batch: memoryview | bytearray, epoch: int) -> None:
    """Patch partitionLeaderEpoch in place (not covered by the CRC)."""
    _I.pack_into(batch, 12, epoch)


_PATCH = struct.Struct(">qii")


def patch_batch(batch: memoryview | bytearray, offset: int, length: int, epoch: int) -> None:
    """Patch baseOffset and partitionLeaderEpoch in place in one call, rewriting the
    batch's own ``batchLength`` (``length``) between them; none is covered by the CRC."""
    _PATCH.pack_into(batch, 0, offset, length, epoch)


def set_log_append_time(batch: memoryview | bytearray, timestamp_ms: int) -> None:
    """Mark the batch LogAppendTime with ``timestamp_ms`` as its max timestamp and fix
    the CRC (these fields are covered by it), as Kafka does for such topics."""
    hdr = read_header(batch)
    struct.pack_into(">h", batch, 21, hdr.attributes | TIMESTAMP_TYPE_MASK)
    struct.pack_into(">q", batch, 35, timestamp_ms)
    struct.pack_into(">I", batch, 17, crc32c(memoryview(batch)[CRC_START : hdr.size]))
