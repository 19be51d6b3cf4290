"""Request framing and request-header parsing, done by hand (no kafka-python).

A Kafka request on the wire is ``int32 size`` followed by ``size`` bytes: the request
header, then the body. The header is::

    int16 api_key, int16 api_version, int32 correlation_id,
    int16-length nullable string client_id          (never compact, even in header v2)
    tagged fields                                   (header v2: flexible request versions)

Header parsing never fails because of the version: an API key or version this build does
not know still yields a header (so the broker can answer ApiVersions with its fallback, or
close the connection with a log line). Truncated or malformed headers raise
:class:`MalformedFrameError` (a :class:`KafkaProtocolError` with ``CORRUPT_MESSAGE``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from protocol.apis import is_flexible
from protocol.errors import ErrorCode, KafkaProtocolError

Buffer = bytes | bytearray | memoryview

FRAME_SIZE = struct.Struct(">i")
"""The 4-byte big-endian size prefix of every request and response frame."""

_HEADER_FIXED = struct.Struct(">hhih")  # api_key, api_version, correlation_id, client_id len


class MalformedFrameError(KafkaProtocolError):
    """A frame or header that cannot be parsed (truncated, bad lengths)."""

    def __init__(self, message: str = "") -> None:
        super().__init__(ErrorCode.CORRUPT_MESSAGE, message)


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    size: int  # header bytes consumed: the body starts at frame[size:]


def is_flexible_request(api_key: int, api_version: int) -> bool:
    """True when ``api_version`` of ``api_key`` uses the flexible (compact, tagged) encoding
    (``protocol.apis`` decides, for requests and responses alike)."""
    return is_flexible(api_key, api_version)


def read_frame_size(buf: Buffer, max_size: int = 0x7FFFFFFF) -> int:
    """Decode the 4-byte size prefix at the start of ``buf``.

    Raises :class:`MalformedFrameError` for fewer than 4 bytes, a negative size, or a size
    above ``max_size``.
    """
    if len(buf) < FRAME_SIZE.size:
        raise MalformedFrameError("frame size prefix truncated")
    (size,) = FRAME_SIZE.unpack_from(buf, 0)
    if size < 0 or size > max_size:
        raise MalformedFrameError(f"invalid frame size {size}")
    return int(size)


def uvarint(value: int) -> bytes:
    """Encode an unsigned varint (compact lengths and tagged-field counts)."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value & ~0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_uvarint(buf: Buffer, pos: int) -> tuple[int, int]:
    """Decode an unsigned varint (at most 5 bytes) at ``pos``; return (value, new pos)."""
    value = 0
    shift = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise MalformedFrameError("varint truncated")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise MalformedFrameError("varint too long")


def skip_tagged_fields(buf: Buffer, pos: int) -> int:
    """Skip a tagged-field section at ``pos``; return the position after it."""
    count, pos = read_uvarint(buf, pos)
    end = len(buf)
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        pos += size
        if pos > end:
            raise MalformedFrameError("tagged field truncated")
    return pos


def parse_request_header(frame: memoryview) -> RequestHeader:
    """Parse the request header at the start of ``frame`` (the bytes after the size prefix).

    Never raises because of an unknown key or version; raises :class:`MalformedFrameError`
    on truncation or bad lengths. An invalid UTF-8 ``client_id`` is decoded with
    replacement characters, as Java brokers do.
    """
    end = len(frame)
    if end < _HEADER_FIXED.size:
        raise MalformedFrameError("request header truncated")
    api_key, api_version, correlation_id, id_len = _HEADER_FIXED.unpack_from(frame, 0)
    pos = _HEADER_FIXED.size
    client_id: str | None = None
    if id_len >= 0:
        if pos + id_len > end:
            raise MalformedFrameError("client_id truncated")
        client_id = str(frame[pos : pos + id_len], "utf-8", "replace")
        pos += id_len
    elif id_len != -1:
        raise MalformedFrameError(f"invalid client_id length {id_len}")
    if is_flexible_request(api_key, api_version):
        pos = skip_tagged_fields(frame, pos)
    return RequestHeader(api_key, api_version, correlation_id, client_id, pos)
