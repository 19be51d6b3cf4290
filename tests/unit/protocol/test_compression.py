"""Tests for protocol.compression: every codec, xerial snappy framing, errors."""

from __future__ import annotations

import gzip
import os
import struct

import cramjam
import kafka.codec as kafka_codec
import pytest
import zstandard

from protocol.compression import (
    XERIAL_MAGIC,
    Compression,
    compress,
    decompress,
    xerial_compress,
)
from protocol.errors import ErrorCode, KafkaProtocolError
from tests.unit.protocol import _kafka_codecs

PAYLOADS = [
    b"",
    b"x",
    b"hello kafka " * 1000,
    os.urandom(70_000),  # incompressible, spans several snappy/lz4 blocks
    bytes(range(256)) * 600,
]
CODECS = list(Compression)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("idx", range(len(PAYLOADS)))
def test_round_trip(codec: Compression, idx: int) -> None:
    data = PAYLOADS[idx]
    packed = compress(codec, data)
    assert decompress(codec, packed) == data
    assert decompress(codec, memoryview(packed)) == data
    assert decompress(codec, bytearray(packed)) == data


def test_compression_actually_compresses() -> None:
    data = b"abcdefgh" * 10_000
    for codec in CODECS[1:]:
        assert len(compress(codec, data)) < len(data) // 10, codec.name


def test_none_is_identity() -> None:
    assert compress(Compression.NONE, b"abc") == b"abc"
    assert decompress(Compression.NONE, memoryview(b"abc")) == b"abc"


def test_gzip_reads_stdlib_and_concatenated_members() -> None:
    assert decompress(Compression.GZIP, gzip.compress(b"abc")) == b"abc"
    two = gzip.compress(b"abc") + gzip.compress(b"def")
    assert decompress(Compression.GZIP, two) == b"abcdef"
    assert gzip.decompress(compress(Compression.GZIP, b"xyz" * 50)) == b"xyz" * 50


def test_zstd_frames_without_content_size_and_multiple_frames() -> None:
    data = os.urandom(1000) * 50
    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(data)
    assert decompress(Compression.ZSTD, no_size) == data
    cobj = zstandard.ZstdCompressor().compressobj()  # streaming: no content size
    streamed = cobj.compress(data) + cobj.flush()
    assert decompress(Compression.ZSTD, streamed) == data
    assert decompress(Compression.ZSTD, no_size + streamed) == data + data
    assert (
        zstandard.ZstdDecompressor().decompress(
            compress(Compression.ZSTD, data), max_output_size=len(data)
        )
        == data
    )


def test_snappy_raw_and_framed() -> None:
    data = b"raw snappy " * 500
    assert decompress(Compression.SNAPPY, bytes(cramjam.snappy.compress_raw(data))) == data
    assert decompress(Compression.SNAPPY, bytes(cramjam.snappy.compress(data))) == data


def _hand_xerial(blocks: list[bytes], version_fmt: str = ">ii") -> bytes:
    out = b"\x82SNAPPY\x00" + struct.pack(version_fmt, 1, 1)
    for block in blocks:
        raw = bytes(cramjam.snappy.compress_raw(block))
        out += struct.pack(">i", len(raw)) + raw
    return out


def test_snappy_hand_written_xerial_frame() -> None:
    blocks = [b"a" * 32768, b"b" * 100, os.urandom(5000)]
    assert decompress(Compression.SNAPPY, _hand_xerial(blocks)) == b"".join(blocks)
    # redpanda-style little-endian version/compat fields are tolerated
    assert decompress(Compression.SNAPPY, _hand_xerial(blocks, "<ii")) == b"".join(blocks)
    assert decompress(Compression.SNAPPY, _hand_xerial([])) == b""


def test_snappy_writes_xerial_frames_kafka_python_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _kafka_codecs.install(monkeypatch)
    data = os.urandom(40_000) + b"z" * 80_000
    ours = compress(Compression.SNAPPY, data)
    assert ours.startswith(XERIAL_MAGIC + b"\x00\x00\x00\x01\x00\x00\x00\x01")
    assert kafka_codec.snappy_decode(ours) == data
    theirs = kafka_codec.snappy_encode(data, xerial_compatible=True, xerial_blocksize=4096)
    assert theirs.startswith(XERIAL_MAGIC)
    assert decompress(Compression.SNAPPY, theirs) == data
    assert decompress(Compression.SNAPPY, kafka_codec.snappy_encode(data, False)) == data


def test_xerial_block_size() -> None:
    data = os.urandom(10_000)
    framed = xerial_compress(data, block_size=1000)
    pos, blocks = 16, 0
    while pos < len(framed):
        (n,) = struct.unpack_from(">i", framed, pos)
        pos += 4 + n
        blocks += 1
    assert blocks == 10 and pos == len(framed)


def test_lz4_frame_has_independent_blocks() -> None:
    packed = compress(Compression.LZ4, os.urandom(200_000))
    assert packed[:4] == b"\x04\x22\x4d\x18"
    flg = packed[4]
    assert flg >> 6 == 1  # version 01
    assert flg & 0x20  # block independence (Java's KafkaLZ4BlockInputStream requires it)


def test_lz4_reads_linked_block_frames() -> None:
    data = b"linked " * 40_000
    assert decompress(Compression.LZ4, bytes(cramjam.lz4.compress(data))) == data


@pytest.mark.parametrize("codec", [5, 6, 7, 8, -1])
def test_unknown_codec(codec: int) -> None:
    with pytest.raises(KafkaProtocolError) as err:
        decompress(codec, b"abc")
    assert err.value.code is ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
    with pytest.raises(KafkaProtocolError) as err:
        compress(codec, b"abc")
    assert err.value.code is ErrorCode.UNSUPPORTED_COMPRESSION_TYPE


CORRUPT = {
    Compression.GZIP: [b"", b"\x1f\x8b\x08", b"not gzip at all"],
    Compression.SNAPPY: [
        b"\xff\xff\xff\xff\xff",
        b"\x82SNAPPY\x00\x00\x00",  # truncated xerial header
        b"\x82SNAPPY\x00" + struct.pack(">iii", 1, 1, 50) + b"abc",  # block past end
        b"\x82SNAPPY\x00" + struct.pack(">iii", 1, 1, -5),  # negative block length
        b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + b"\x00\x00",  # truncated length
    ],
    Compression.LZ4: [b"", b"\x04\x22\x4d\x18\x64\x40", os.urandom(64)],
    Compression.ZSTD: [b"", b"\x28\xb5\x2f\xfd", os.urandom(64)],
}


@pytest.mark.parametrize(("codec", "data"), [(c, d) for c, ds in CORRUPT.items() for d in ds])
def test_corrupt_input_is_corrupt_message(codec: Compression, data: bytes) -> None:
    with pytest.raises(KafkaProtocolError) as err:
        decompress(codec, data)
    assert err.value.code is ErrorCode.CORRUPT_MESSAGE


@pytest.mark.parametrize("codec", CODECS[1:])
def test_truncated_compressed_data_is_corrupt(codec: Compression) -> None:
    packed = compress(codec, os.urandom(5000))
    with pytest.raises(KafkaProtocolError) as err:
        decompress(codec, packed[: len(packed) // 2])
    assert err.value.code is ErrorCode.CORRUPT_MESSAGE


def test_decompress_into_never_writes_past_its_buffer() -> None:
    """A gzip bomb (20 members of 10 MB of zeros: 200 MB from ~200 KB) into a 1 MiB
    buffer: CORRUPT_MESSAGE, with nothing allocated beyond the caller's buffer."""
    import cramjam

    from protocol.compression import decompress_into

    member = bytes(cramjam.gzip.compress(bytes(10_000_000)))
    bomb = member * 20
    out = memoryview(bytearray(1 << 20))
    with pytest.raises(KafkaProtocolError) as info:
        decompress_into(Compression.GZIP, bomb, out)
    assert info.value.code == ErrorCode.CORRUPT_MESSAGE
    small = bytes(cramjam.gzip.compress(b"abc" * 100)) * 2
    assert decompress_into(Compression.GZIP, small, out) == 600
    assert bytes(out[:600]) == b"abc" * 200


def _variants() -> list[tuple[Compression, bytes]]:
    data = os.urandom(1000) * 50
    cobj = zstandard.ZstdCompressor().compressobj()
    blocks = [b"a" * 32768, b"b" * 100, os.urandom(5000)]
    out = [(c, compress(c, p)) for c in CODECS[1:] for p in PAYLOADS]
    out += [
        (Compression.GZIP, gzip.compress(b"abc") + gzip.compress(b"def")),
        (Compression.ZSTD, zstandard.ZstdCompressor(write_content_size=False).compress(data)),
        (Compression.ZSTD, cobj.compress(data) + cobj.flush()),
        (Compression.SNAPPY, bytes(cramjam.snappy.compress_raw(data))),
        (Compression.SNAPPY, bytes(cramjam.snappy.compress(data))),
        (Compression.SNAPPY, _hand_xerial(blocks)),
        (Compression.SNAPPY, _hand_xerial(blocks, "<ii")),
        (Compression.SNAPPY, _hand_xerial([])),
        (Compression.LZ4, bytes(cramjam.lz4.compress(b"linked " * 40_000))),
    ]
    return out + [(c, d) for c, ds in CORRUPT.items() for d in ds]


@pytest.mark.parametrize(("codec", "data"), _variants())
def test_decompress_into_agrees_with_decompress(codec: Compression, data: bytes) -> None:
    from protocol.compression import decompress_into

    out = memoryview(bytearray(4 << 20))
    try:
        expected: bytes | int = decompress(codec, data)
    except KafkaProtocolError as exc:
        expected = int(exc.code)
    try:
        n = decompress_into(codec, data, out)
        got: bytes | int = bytes(out[:n])
    except KafkaProtocolError as exc:
        got = int(exc.code)
    assert got == expected
