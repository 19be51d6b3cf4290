"""Record-level helpers of log compaction, no I/O (docs/format.md, "Compacted segments").

``split_records`` cuts a batch's (decompressed) records section into the raw bytes of each
record plus the few fields compaction decides on (offset, timestamp, key, whether the value
is null). ``rebuild_batch`` writes a batch holding a subset of those records **byte for
byte** (their offset and timestamp deltas stay relative to the original base offset and
base timestamp, so offsets, timestamps and headers are preserved), with the original
producer fields and ``lastOffsetDelta`` (the idempotent producer's sequence range and the
consumer's next offset survive), re-compressed with the codec asked for. With no record
left it writes Kafka's empty batch header (0 records, uncompressed), which compaction keeps
for a producer's last batch. ``first_keyless`` finds a record without a key (Produce to a
compacted topic refuses it).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from protocol.batch import (
    BATCH_HEADER_SIZE,
    COMPRESSION_MASK,
    TIMESTAMP_TYPE_MASK,
    BatchHeader,
    crc32c,
)
from protocol.compression import compress
from protocol.errors import ErrorCode, KafkaProtocolError
from protocol.fastrecords import decode_buffers
from protocol.records import Buf, records_section
from protocol.validate import BatchRejected

_HDR_TAIL = struct.Struct(">hiqqqhii")  # attributes .. recordsCount (CRC-covered)
_HDR_HEAD = struct.Struct(">qiibI")  # baseOffset .. crc


@dataclass(frozen=True, slots=True)
class RawRecord:
    offset: int
    timestamp: int
    key: bytes | None
    tombstone: bool  # the value is null
    raw: bytes  # the whole record, length prefix included, as stored


def _corrupt(message: str) -> KafkaProtocolError:
    return KafkaProtocolError(ErrorCode.CORRUPT_MESSAGE, message)


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise _corrupt("varint too long")


def split_records(batch: Buf) -> tuple[BatchHeader, list[RawRecord]]:
    """The header and every record of one v2 batch (decompressed). Raises
    KafkaProtocolError(CORRUPT_MESSAGE) on malformed records."""
    hdr, data = records_section(batch, False)
    out: list[RawRecord] = []
    pos = 0
    append_time = bool(hdr.attributes & TIMESTAMP_TYPE_MASK)
    try:
        for _ in range(hdr.record_count):
            length, body = _varint(data, pos)
            end = body + length
            if length < 0 or end > len(data):
                raise _corrupt("record length out of bounds")
            p = body + 1  # attributes
            ts_delta, p = _varint(data, p)
            off_delta, p = _varint(data, p)
            klen, p = _varint(data, p)
            key = None if klen < 0 else data[p : p + klen]
            p += max(klen, 0)
            vlen, p = _varint(data, p)
            ts = hdr.max_timestamp if append_time else hdr.base_timestamp + ts_delta
            out.append(RawRecord(hdr.base_offset + off_delta, ts, key, vlen < 0, data[pos:end]))
            pos = end
    except IndexError as exc:
        raise _corrupt(f"malformed record: {exc}") from exc
    return hdr, out


def record_columns(batch: Buf) -> list[RawRecord]:
    """The records of one batch without their raw bytes (``raw`` empty), decoded by the
    native decoder when it is built: what compaction decides on."""
    if read_count(batch) == 0:
        return []
    hdr, section = records_section(batch, False)
    out: list[RawRecord] = []
    for rb in decode_buffers([(section, hdr)], strict_utf8=False):
        for off, ts, key, value in zip(
            rb.offset_list(), rb.timestamp_list(), rb.key_list(), rb.value_list(), strict=True
        ):
            out.append(RawRecord(off, ts, key, value is None, b""))
    return out


def first_keyless(batch: Buf) -> int | None:
    """Index of the first record without a key in ``batch`` (None: every record has one)."""
    if read_count(batch) == 0:
        return None
    hdr, section = records_section(batch, False)
    (rb,) = decode_buffers([(section, hdr)], strict_utf8=False)  # native when built
    for i, key in enumerate(rb.key_list()):
        if key is None:
            return i
    return None


def read_count(batch: Buf) -> int:
    return int(struct.unpack_from(">i", batch, 57)[0])


def rebuild_batch(
    hdr: BatchHeader, records: list[RawRecord], codec: int, max_timestamp: int | None = None
) -> bytes:
    """A batch with ``hdr``'s offsets, producer fields and ``lastOffsetDelta`` holding
    ``records`` (a subset of its own, in order), compressed with ``codec``. Without
    records: Kafka's empty batch header (uncompressed, the original timestamps)."""
    raw = b"".join(r.raw for r in records)
    attributes = hdr.attributes & ~COMPRESSION_MASK
    if records and codec:
        body = compress(codec, raw)
        attributes |= codec & COMPRESSION_MASK
    else:
        body = raw
    if max_timestamp is None:
        if not records or hdr.attributes & TIMESTAMP_TYPE_MASK:
            max_timestamp = hdr.max_timestamp
        else:
            max_timestamp = max(r.timestamp for r in records)
    tail = _HDR_TAIL.pack(
        attributes,
        hdr.last_offset_delta,
        hdr.base_timestamp,
        max_timestamp,
        hdr.producer_id,
        hdr.producer_epoch,
        hdr.base_sequence,
        len(records),
    )
    crc = crc32c(body, crc32c(tail))
    length = BATCH_HEADER_SIZE - 12 + len(body)
    head = _HDR_HEAD.pack(hdr.base_offset, length, hdr.partition_leader_epoch, 2, crc)
    return b"".join((head, tail, body))


def require_keys(batches: list[tuple[BatchHeader, memoryview]]) -> None:
    """Produce to a compacted topic: raise ``BatchRejected(INVALID_RECORD)`` naming the
    first record without a key, as Kafka's LogValidator does."""
    index = 0
    for hdr, view in batches:
        if hdr.is_control:
            continue
        keyless = first_keyless(view)
        if keyless is not None:
            raise BatchRejected(
                ErrorCode.INVALID_RECORD,
                "Compacted topic cannot accept message without key",
                index + keyless,
            )
        index += hdr.record_count
