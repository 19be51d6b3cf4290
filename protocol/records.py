"""Kafka v2 record decoding and encoding (the part of a RecordBatch after its 61-byte header).

Record (all varints are zigzag-encoded):

    length varint | attributes int8 | timestampDelta varlong | offsetDelta varint |
    keyLength varint | key | valueLength varint | value |
    headerCount varint | [headerKeyLength varint | headerKey | headerValueLength varint | value]

A length of -1 means null (key, value, header value). The decoder is written as one flat
loop over ``bytes`` with the one-byte varint case inlined: it is the ingest job's hot path.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass

from protocol.batch import (
    BATCH_HEADER_SIZE,
    COMPRESSION_MASK,
    CONTROL_MASK,
    CRC_START,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    BatchHeader,
    CorruptBatchError,
    crc32c,
    read_header,
)
from protocol.compression import Compression, compress, decompress
from protocol.errors import ErrorCode, KafkaProtocolError

Buf = bytes | bytearray | memoryview
Header = tuple[str, bytes | None]
Headers = tuple[Header, ...]
RecordInput = tuple[bytes | None, bytes | None, Sequence[Header] | None]

_NO_HEADERS: Headers = ()
# zigzag decode of a one-byte varint (0..127)
_ZZ = tuple((b >> 1) ^ -(b & 1) for b in range(128))
_HDR_TAIL = struct.Struct(">hiqqqhii")  # attributes .. recordsCount (CRC-covered header part)
_HDR_HEAD = struct.Struct(">qiibI")  # baseOffset .. crc
_MAX_VARINT_SHIFT = 63
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Headers


@dataclass(frozen=True, slots=True)
class BatchColumns:
    """One batch decoded column-wise (index i of every list is record i)."""

    header: BatchHeader
    offsets: list[int]
    timestamps: list[int]
    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[Headers]

    def __len__(self) -> int:
        return len(self.offsets)


def _corrupt(message: str) -> KafkaProtocolError:
    return KafkaProtocolError(ErrorCode.CORRUPT_MESSAGE, message)


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """Multi-byte zigzag varint starting at ``pos``: returns (value, next pos)."""
    result = 0
    shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            if result >> 64:  # a 10th byte carrying more than bit 63
                raise _corrupt("varint too long")
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > _MAX_VARINT_SHIFT:
            raise _corrupt("varint too long")


def records_section(batch: Buf, check_crc: bool) -> tuple[BatchHeader, bytes]:
    """Validate framing and return the header and the (decompressed) records bytes."""
    try:
        hdr = read_header(batch)
    except CorruptBatchError as exc:
        raise _corrupt(str(exc)) from exc
    if hdr.magic != 2:
        raise _corrupt(f"record batch magic {hdr.magic}, expected 2")
    size = hdr.size
    if size < BATCH_HEADER_SIZE or size > len(batch):
        raise _corrupt("record batch length out of bounds")
    if hdr.record_count < 0:
        raise _corrupt("negative record count")
    view = memoryview(batch)
    if check_crc and crc32c(view[CRC_START:size]) != hdr.crc:
        raise _corrupt("record batch CRC-32C mismatch")
    body = view[BATCH_HEADER_SIZE:size]
    codec = hdr.attributes & COMPRESSION_MASK
    data = decompress(codec, body) if codec else bytes(body)
    return hdr, data


def decode_batch_columns(batch: Buf, *, check_crc: bool = False) -> BatchColumns:
    """Decode every record of one v2 batch into per-column lists.

    Offsets are ``baseOffset + offsetDelta``; timestamps ``baseTimestamp + delta`` or, for
    LOG_APPEND_TIME batches, the batch's ``maxTimestamp``. Raises
    ``KafkaProtocolError(CORRUPT_MESSAGE)`` on malformed input (and
    ``UNSUPPORTED_COMPRESSION_TYPE`` on an unknown codec).
    """
    hdr, buf = records_section(batch, check_crc)
    try:
        cols = decode_records_section(buf, hdr)
    except (IndexError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise _corrupt(f"malformed record: {exc}") from exc
    check_int64_range(cols[0], cols[1])
    return BatchColumns(hdr, *cols)


def check_int64_range(offsets: list[int], timestamps: list[int]) -> None:
    """Raise CORRUPT_MESSAGE if a decoded offset or timestamp is outside int64."""
    for name, col in (("offset", offsets), ("timestamp", timestamps)):
        if col and (min(col) < _INT64_MIN or max(col) > _INT64_MAX):
            raise _corrupt(f"record {name} out of the 64-bit range")


def decode_batch(batch: Buf, *, check_crc: bool = False) -> tuple[BatchHeader, list[Record]]:
    """Decode one v2 batch into ``Record`` values (see ``decode_batch_columns``)."""
    c = decode_batch_columns(batch, check_crc=check_crc)
    return c.header, list(map(Record, c.offsets, c.timestamps, c.keys, c.values, c.headers))


def decode_records_section(
    buf: bytes, hdr: BatchHeader, errors: str = "strict"
) -> tuple[list[int], list[int], list[bytes | None], list[bytes | None], list[Headers]]:
    # The hot loop of the ingest job, deliberately kept as one flat function: one- and
    # two-byte varints are decoded inline (a call per field cost ~30% throughput), list
    # appends are bound once. Out-of-range reads raise IndexError, mapped by the caller.
    offsets: list[int] = []
    timestamps: list[int] = []
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    headers: list[Headers] = []
    add_offset = offsets.append
    add_ts = timestamps.append
    add_key = keys.append
    add_value = values.append
    add_headers = headers.append
    base_offset = hdr.base_offset
    base_ts = hdr.base_timestamp
    zz = _ZZ
    varint = _varint
    no_headers = _NO_HEADERS
    pos = 0
    n = len(buf)
    for _ in range(hdr.record_count):
        b = buf[pos]
        if b < 0x80:
            end = pos + 1 + zz[b]
            pos += 2  # length + attributes (unused)
        elif buf[pos + 1] < 0x80:  # two-byte varint: records of 64 B .. 8 KiB
            raw = (b & 0x7F) | (buf[pos + 1] << 7)
            end = pos + 2 + ((raw >> 1) ^ -(raw & 1))
            pos += 3
        else:
            length, pos = varint(buf, pos)
            end = pos + length
            pos += 1
        if end > n or end < pos:
            raise _corrupt("record length out of bounds")
        b = buf[pos]
        if b < 0x80:
            add_ts(base_ts + zz[b])
            pos += 1
        elif buf[pos + 1] < 0x80:
            raw = (b & 0x7F) | (buf[pos + 1] << 7)
            add_ts(base_ts + ((raw >> 1) ^ -(raw & 1)))
            pos += 2
        else:
            delta, pos = varint(buf, pos)
            add_ts(base_ts + delta)
        b = buf[pos]
        if b < 0x80:
            add_offset(base_offset + zz[b])
            pos += 1
        else:
            delta, pos = varint(buf, pos)
            add_offset(base_offset + delta)
        b = buf[pos]
        if b < 0x80:
            klen = zz[b]
            pos += 1
        else:
            klen, pos = varint(buf, pos)
        if klen >= 0:
            add_key(buf[pos : pos + klen])
            pos += klen
        elif klen == -1:
            add_key(None)
        else:
            raise _corrupt("negative key length")
        b = buf[pos]
        if b < 0x80:
            vlen = zz[b]
            pos += 1
        elif buf[pos + 1] < 0x80:
            raw = (b & 0x7F) | (buf[pos + 1] << 7)
            vlen = (raw >> 1) ^ -(raw & 1)
            pos += 2
        else:
            vlen, pos = varint(buf, pos)
        if vlen >= 0:
            add_value(buf[pos : pos + vlen])
            pos += vlen
        elif vlen == -1:
            add_value(None)
        else:
            raise _corrupt("negative value length")
        if buf[pos] == 0:
            add_headers(no_headers)
            pos += 1
        else:
            hs, pos = _decode_headers(buf, pos, errors)
            add_headers(hs)
        if pos != end:
            raise _corrupt("record length does not match its fields")
    if pos != n:
        raise _corrupt("trailing bytes after the last record")
    if hdr.attributes & TIMESTAMP_TYPE_MASK:  # LOG_APPEND_TIME: every record gets maxTimestamp
        timestamps = [hdr.max_timestamp] * len(offsets)
    return offsets, timestamps, keys, values, headers


def _decode_headers(buf: bytes, pos: int, errors: str = "strict") -> tuple[Headers, int]:
    b = buf[pos]
    if b < 0x80:
        count = _ZZ[b]
        pos += 1
    else:
        count, pos = _varint(buf, pos)
    if count < 0:
        raise _corrupt("negative header count")
    out: list[Header] = []
    for _ in range(count):
        klen, pos = _varint(buf, pos)
        if klen < 0:
            raise _corrupt("negative header key length")
        key = buf[pos : pos + klen].decode("utf-8", errors)
        pos += klen
        vlen, pos = _varint(buf, pos)
        if vlen >= 0:
            out.append((key, buf[pos : pos + vlen]))
            pos += vlen
        elif vlen == -1:
            out.append((key, None))
        else:
            raise _corrupt("negative header value length")
    if pos > len(buf):
        raise _corrupt("truncated record header")
    return tuple(out), pos


def offset_for_timestamp(batch: Buf, ts: int) -> int | None:
    """First offset in the batch whose timestamp is >= ``ts``, or None if there is none."""
    try:
        hdr = read_header(batch)
    except CorruptBatchError as exc:
        raise _corrupt(str(exc)) from exc
    if hdr.max_timestamp < ts and hdr.record_count > 0 and hdr.max_timestamp >= 0:
        return None  # maxTimestamp bounds every record's timestamp
    if hdr.attributes & TIMESTAMP_TYPE_MASK:
        return hdr.base_offset if hdr.max_timestamp >= ts and hdr.record_count else None
    c = decode_batch_columns(batch)
    for offset, t in zip(c.offsets, c.timestamps, strict=True):
        if t >= ts:
            return offset
    return None


# ------------------------------------------------------------------------------ encoding


def encode_varint(value: int, out: bytearray) -> None:
    """Append ``value`` as a zigzag varint (64-bit range) to ``out``."""
    v = ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _encode_bytes(data: bytes | None, out: bytearray) -> None:
    if data is None:
        out.append(1)  # zigzag(-1)
    else:
        encode_varint(len(data), out)
        out += data


def _encode_record(rec: RecordInput, offset_delta: int, ts_delta: int, out: bytearray) -> None:
    key, value, hdrs = rec
    body = bytearray(b"\x00")  # attributes
    encode_varint(ts_delta, body)
    encode_varint(offset_delta, body)
    _encode_bytes(key, body)
    _encode_bytes(value, body)
    hdrs = hdrs or ()
    encode_varint(len(hdrs), body)
    for hkey, hval in hdrs:
        _encode_bytes(hkey.encode("utf-8"), body)
        _encode_bytes(hval, body)
    encode_varint(len(body), out)
    out += body


def build_batch(
    records: Sequence[RecordInput],
    base_offset: int = 0,
    base_timestamp: int | None = None,
    compression: int = Compression.NONE,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    timestamps: Sequence[int] | None = None,
    transactional: bool = False,
    *,
    log_append_time: bool = False,
    control: bool = False,
    partition_leader_epoch: int = -1,
) -> bytes:
    """Build one v2 RecordBatch (CRC-32C set) from (key, value, headers) tuples.

    Record i gets offset delta i and timestamp ``timestamps[i]`` (default: every record at
    ``base_timestamp``, itself defaulting to ``timestamps[0]`` or the current time in ms).
    """
    if not records:
        raise ValueError("a record batch needs at least one record")
    if timestamps is not None and len(timestamps) != len(records):
        raise ValueError("timestamps must have one entry per record")
    if base_timestamp is None:
        base_timestamp = timestamps[0] if timestamps else int(time.time() * 1000)
    ts = list(timestamps) if timestamps is not None else [base_timestamp] * len(records)
    raw = bytearray()
    for i, rec in enumerate(records):
        _encode_record(rec, i, ts[i] - base_timestamp, raw)
    codec = Compression(compression)
    body = compress(codec, raw) if codec else bytes(raw)
    attributes = int(codec)
    if log_append_time:
        attributes |= TIMESTAMP_TYPE_MASK
    if transactional:
        attributes |= TRANSACTIONAL_MASK
    if control:
        attributes |= CONTROL_MASK
    tail = _HDR_TAIL.pack(
        attributes,
        len(records) - 1,
        base_timestamp,
        max(ts),
        producer_id,
        producer_epoch,
        base_sequence,
        len(records),
    )
    crc = crc32c(body, crc32c(tail))
    batch_length = BATCH_HEADER_SIZE - 12 + len(body)
    head = _HDR_HEAD.pack(base_offset, batch_length, partition_leader_epoch, 2, crc)
    return b"".join((head, tail, body))
