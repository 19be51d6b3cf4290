"""Conversion of legacy (magic 0/1) MessageSets into v2 RecordBatches.

Produce v0-v2 clients send a MessageSet: repeated

    offset int64 | messageSize int32 | crc uint32 | magic int8 | attributes int8 |
    [timestamp int64, magic 1 only] | key bytes (int32 length, -1 = null) | value bytes

where the CRC (zlib CRC-32) covers magic..end of message. A message whose attributes carry a
codec is a *wrapper*: its value is a compressed inner MessageSet. Each wrapper becomes one
v2 batch with the same codec (re-compressed); each run of uncompressed top-level messages
becomes one uncompressed batch. Offsets are renumbered from ``base_offset_hint`` (the broker
assigns real offsets anyway); magic 0 messages get timestamp -1 (NO_TIMESTAMP).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator

from protocol.compression import Compression, decompress
from protocol.errors import ErrorCode, KafkaProtocolError
from protocol.records import RecordInput, build_batch

Buf = bytes | bytearray | memoryview

_ENTRY = struct.Struct(">qi")  # offset, messageSize
_MSG0 = struct.Struct(">Ibb")  # crc, magic, attributes
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
LOG_OVERHEAD = 12
MAGIC_OFFSET = 16  # offset(8) + size(4) + crc(4)
_CODEC_MASK = 0x07
_TIMESTAMP_TYPE_MASK = 0x08
NO_TIMESTAMP = -1
_MAX_DEPTH = 2  # top level + one level of wrapper nesting

LegacyMessage = tuple[int, bytes | None, bytes | None]  # timestamp, key, value


def is_legacy(buf: Buf) -> bool:
    """True when the records start with a magic 0 or 1 message (byte 16)."""
    return len(buf) > MAGIC_OFFSET and buf[MAGIC_OFFSET] in (0, 1)


def _corrupt(message: str) -> KafkaProtocolError:
    return KafkaProtocolError(ErrorCode.CORRUPT_MESSAGE, message)


def _read_bytes(view: memoryview, pos: int, end: int) -> tuple[bytes | None, int]:
    if end - pos < 4:
        raise _corrupt("truncated legacy message")
    (n,) = _I32.unpack_from(view, pos)
    pos += 4
    if n == -1:
        return None, pos
    if n < 0 or pos + n > end:
        raise _corrupt("legacy message field length out of bounds")
    return bytes(view[pos : pos + n]), pos + n


def _iter_messages(
    view: memoryview,
) -> Iterator[tuple[int, int, int, bytes | None, bytes | None]]:
    """Yield (magic, attributes, timestamp, key, value) per message; validates CRC32."""
    pos = 0
    end = len(view)
    while pos < end:
        if end - pos < LOG_OVERHEAD:
            raise _corrupt("truncated legacy message set entry")
        _, size = _ENTRY.unpack_from(view, pos)
        start = pos + LOG_OVERHEAD
        stop = start + size
        if size < _MSG0.size + 8 or stop > end:
            raise _corrupt("legacy message size out of bounds")
        crc, magic, attributes = _MSG0.unpack_from(view, start)
        if magic not in (0, 1):
            raise _corrupt(f"legacy message magic {magic}")
        if zlib.crc32(view[start + 4 : stop]) != crc:
            raise _corrupt("legacy message CRC32 mismatch")
        p = start + _MSG0.size
        timestamp = NO_TIMESTAMP
        if magic == 1:
            if stop - p < 8:
                raise _corrupt("truncated legacy message timestamp")
            (timestamp,) = _I64.unpack_from(view, p)
            p += 8
        key, p = _read_bytes(view, p, stop)
        value, p = _read_bytes(view, p, stop)
        if p != stop:
            raise _corrupt("legacy message size does not match its fields")
        yield magic, attributes, timestamp, key, value
        pos = stop


def _decompress_legacy(codec: int, magic: int, data: bytes) -> bytes:
    if codec == Compression.LZ4 and magic == 0:
        try:
            return decompress(codec, data)
        except KafkaProtocolError:
            # Kafka < 0.10 computed the LZ4 frame header checksum over the magic too.
            return decompress(codec, fix_lz4_header_checksum(data))
    return decompress(codec, data)


def _unwrap(
    magic: int, attributes: int, timestamp: int, value: bytes | None, depth: int
) -> list[LegacyMessage]:
    if value is None:
        raise _corrupt("compressed legacy wrapper message without a value")
    if depth >= _MAX_DEPTH:
        raise _corrupt("nested compressed legacy messages")
    inner = _decompress_legacy(attributes & _CODEC_MASK, magic, value)
    log_append = magic == 1 and bool(attributes & _TIMESTAMP_TYPE_MASK)
    out: list[LegacyMessage] = []
    for m, attrs, ts, k, v in _iter_messages(memoryview(inner)):
        if attrs & _CODEC_MASK:
            raise _corrupt("nested compressed legacy messages")
        out.append((timestamp if log_append else (ts if m == 1 else NO_TIMESTAMP), k, v))
    return out


def _batch(messages: list[LegacyMessage], base_offset: int, codec: int) -> bytes:
    records: list[RecordInput] = [(k, v, None) for _, k, v in messages]
    ts = [t for t, _, _ in messages]
    return build_batch(records, base_offset=base_offset, compression=codec, timestamps=ts)


def convert_message_set(buf: Buf, base_offset_hint: int = 0) -> bytes:
    """Convert a magic 0/1 MessageSet into concatenated v2 RecordBatches (CRC-32C set).

    Raises ``KafkaProtocolError(CORRUPT_MESSAGE)`` on a bad CRC32 or malformed framing and
    ``UNSUPPORTED_COMPRESSION_TYPE`` on an unknown codec.
    """
    batches: list[bytes] = []
    pending: list[LegacyMessage] = []
    next_offset = base_offset_hint

    def flush(group: list[LegacyMessage], codec: int) -> None:
        nonlocal next_offset
        if group:
            batches.append(_batch(group, next_offset, codec))
            next_offset += len(group)

    for magic, attributes, timestamp, key, value in _iter_messages(memoryview(buf)):
        codec = attributes & _CODEC_MASK
        if not codec:
            pending.append((timestamp, key, value))
            continue
        flush(pending, Compression.NONE)
        pending = []
        if codec > Compression.ZSTD:
            raise KafkaProtocolError(
                ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, f"legacy codec {codec}"
            )
        flush(_unwrap(magic, attributes, timestamp, value, 1), codec)
    flush(pending, Compression.NONE)
    return b"".join(batches)


# ------------------------------------------------------------------- LZ4 header repair

_P1 = 2654435761
_P2 = 2246822519
_P3 = 3266489917
_P4 = 668265263
_P5 = 374761393
_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def xxh32_short(data: bytes, seed: int = 0) -> int:
    """XXH32 of an input shorter than 16 bytes (an LZ4 frame descriptor)."""
    if len(data) >= 16:
        raise ValueError("xxh32_short takes fewer than 16 bytes")
    h = (seed + _P5 + len(data)) & _M32
    pos = 0
    while pos + 4 <= len(data):
        (word,) = struct.unpack_from("<I", data, pos)
        h = (_rotl((h + word * _P3) & _M32, 17) * _P4) & _M32
        pos += 4
    for b in data[pos:]:
        h = (_rotl((h + b * _P5) & _M32, 11) * _P1) & _M32
    h ^= h >> 15
    h = (h * _P2) & _M32
    h ^= h >> 13
    h = (h * _P3) & _M32
    h ^= h >> 16
    return h


def fix_lz4_header_checksum(data: bytes) -> bytes:
    """Rewrite an LZ4 frame's header checksum byte as the LZ4 spec defines it."""
    if len(data) < 7 or data[:4] != b"\x04\x22\x4d\x18":
        return data
    flg = data[4]
    desc_len = 2 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0)
    hc_pos = 4 + desc_len
    if len(data) <= hc_pos:
        return data
    hc = (xxh32_short(data[4:hc_pos]) >> 8) & 0xFF
    return data[:hc_pos] + bytes((hc,)) + data[hc_pos + 1 :]
