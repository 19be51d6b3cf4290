"""Record-batch compression codecs (Kafka attribute bits 0-2), backed by cramjam.

* GZIP: RFC 1952 (one or more members); written at level 6.
* SNAPPY: decodes raw snappy, the xerial block framing Java clients write
  (``\\x82SNAPPY\\x00`` + int32 version + int32 compat + repeated [int32 len, raw block])
  and the official snappy framing format; encodes xerial framing with 32 KiB blocks, which
  Java, librdkafka, Go and kafka-python clients all read.
* LZ4: the LZ4 *frame* format; encodes independent blocks (Kafka's Java client rejects
  linked blocks).
* ZSTD: one or more frames, with or without a content size.

Unknown codec ids raise ``KafkaProtocolError(UNSUPPORTED_COMPRESSION_TYPE)``; data that does
not decode raises ``KafkaProtocolError(CORRUPT_MESSAGE)``.
"""

from __future__ import annotations

import struct
from enum import IntEnum

import cramjam

from protocol.errors import ErrorCode, KafkaProtocolError

Buf = bytes | bytearray | memoryview

XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER_SIZE = 16
XERIAL_BLOCK_SIZE = 32 * 1024
_XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_SNAPPY_FRAMED_MAGIC = b"\xff\x06\x00\x00sNaPpY"
_I32 = struct.Struct(">i")
GZIP_LEVEL = 6
ZSTD_LEVEL = 3
LZ4_LEVEL = 0


class Compression(IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


def _codec(codec: int) -> Compression:
    try:
        return Compression(codec)
    except ValueError:
        raise KafkaProtocolError(
            ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, f"compression codec {codec}"
        ) from None


def _corrupt(codec: Compression, exc: BaseException | None = None) -> KafkaProtocolError:
    detail = f": {exc}" if exc is not None else ""
    return KafkaProtocolError(ErrorCode.CORRUPT_MESSAGE, f"cannot decompress {codec.name}{detail}")


# ---------------------------------------------------------------------------------- gzip


def _gzip_decompress(data: Buf) -> bytes:
    # cramjam (flate2) reads concatenated members and was ~1.5x faster than zlib here.
    return bytes(cramjam.gzip.decompress(data))


def _gzip_compress(data: Buf) -> bytes:
    return bytes(cramjam.gzip.compress(data, level=GZIP_LEVEL))


# -------------------------------------------------------------------------------- snappy


def _snappy_decompress(data: Buf) -> bytes:
    view = memoryview(data)
    if view[:8] == XERIAL_MAGIC:
        return _xerial_decompress(view)
    if view[:10] == _SNAPPY_FRAMED_MAGIC:
        return bytes(cramjam.snappy.decompress(view))
    return bytes(cramjam.snappy.decompress_raw(view))


def _xerial_decompress(view: memoryview) -> bytes:
    # Version/compat ints are ignored: some producers write them little-endian.
    pos = XERIAL_HEADER_SIZE
    end = len(view)
    if end < pos:
        raise ValueError("truncated xerial header")
    out: list[bytes] = []
    while pos < end:
        if end - pos < 4:
            raise ValueError("truncated xerial block length")
        (n,) = _I32.unpack_from(view, pos)
        pos += 4
        if n < 0 or pos + n > end:
            raise ValueError("xerial block length out of bounds")
        out.append(bytes(cramjam.snappy.decompress_raw(view[pos : pos + n])))
        pos += n
    return b"".join(out)


def xerial_compress(data: Buf, block_size: int = XERIAL_BLOCK_SIZE) -> bytes:
    """Snappy with xerial block framing (what Java's SnappyOutputStream writes)."""
    view = memoryview(data)
    parts = [_XERIAL_HEADER]
    for pos in range(0, len(view), block_size):
        block = bytes(cramjam.snappy.compress_raw(view[pos : pos + block_size]))
        parts.append(_I32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


# ----------------------------------------------------------------------------- lz4, zstd


def _lz4_compress(data: Buf) -> bytes:
    c = cramjam.lz4.Compressor(level=LZ4_LEVEL, content_checksum=False, block_linked=False)
    c.compress(data if isinstance(data, bytes) else bytes(data))
    return bytes(c.finish())


def _zstd_compress(data: Buf) -> bytes:
    return bytes(cramjam.zstd.compress(data, level=ZSTD_LEVEL))


# ---------------------------------------------------------------------------------- API


def decompress(codec: int, data: Buf, max_size: int | None = None) -> bytes:
    """Decompress a batch's records section. NONE returns the bytes unchanged.

    ``max_size``: a decompressed section larger than this is CORRUPT_MESSAGE (checked
    after the codec ran: it bounds what is kept, not the codec's transient output).
    """
    c = _codec(codec)
    try:
        if c is Compression.NONE:
            out = bytes(data)
        elif c is Compression.ZSTD:
            out = bytes(cramjam.zstd.decompress(data))
        elif c is Compression.LZ4:
            out = bytes(cramjam.lz4.decompress(data))
        elif c is Compression.SNAPPY:
            out = _snappy_decompress(data)
        else:
            out = _gzip_decompress(data)
    except MemoryError:
        raise
    except Exception as exc:  # any codec failure means the input is corrupt
        raise _corrupt(c, exc) from exc
    if max_size is not None and len(out) > max_size:
        raise KafkaProtocolError(
            ErrorCode.CORRUPT_MESSAGE, f"{c.name} records decompress past {max_size} bytes"
        )
    return out


def decompress_into(codec: int, data: Buf, out: memoryview) -> int:
    """Decompress a compressed records section into ``out``; returns the bytes written.

    The output can never grow past ``out``: a section that decompresses to more (a
    decompression bomb) raises CORRUPT_MESSAGE like any undecodable one, having written at
    most ``len(out)`` bytes. Nothing else is allocated for the output.
    """
    c = _codec(codec)
    if c is Compression.NONE:
        raise ValueError("decompress_into needs a compression codec")
    try:
        if c is Compression.ZSTD:
            return int(cramjam.zstd.decompress_into(data, out))
        if c is Compression.LZ4:
            return int(cramjam.lz4.decompress_into(data, out))
        if c is Compression.SNAPPY:
            return _snappy_decompress_into(memoryview(data), out)
        return int(cramjam.gzip.decompress_into(data, out))
    except MemoryError:
        raise
    except Exception as exc:  # corrupt, or larger than ``out``
        raise _corrupt(c, exc) from exc


def _snappy_decompress_into(view: memoryview, out: memoryview) -> int:
    if view[:8] == XERIAL_MAGIC:
        pos, end, written = XERIAL_HEADER_SIZE, len(view), 0
        if end < pos:
            raise ValueError("truncated xerial header")
        while pos < end:
            if end - pos < 4:
                raise ValueError("truncated xerial block length")
            (n,) = _I32.unpack_from(view, pos)
            pos += 4
            if n < 0 or pos + n > end:
                raise ValueError("xerial block length out of bounds")
            written += int(cramjam.snappy.decompress_raw_into(view[pos : pos + n], out[written:]))
            pos += n
        return written
    if view[:10] == _SNAPPY_FRAMED_MAGIC:
        return int(cramjam.snappy.decompress_into(view, out))
    return int(cramjam.snappy.decompress_raw_into(view, out))


def compress(codec: int, data: Buf) -> bytes:
    """Compress a records section with the given codec. NONE returns the bytes unchanged."""
    c = _codec(codec)
    if c is Compression.NONE:
        return bytes(data)
    if c is Compression.ZSTD:
        return _zstd_compress(data)
    if c is Compression.LZ4:
        return _lz4_compress(data)
    if c is Compression.SNAPPY:
        return xerial_compress(data)
    return _gzip_compress(data)
