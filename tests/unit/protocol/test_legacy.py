"""Tests for protocol.legacy: magic 0/1 MessageSets converted into v2 record batches."""

from __future__ import annotations

import struct
import zlib

import cramjam
import pytest
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from protocol.batch import iter_batches, verify_crc
from protocol.compression import Compression, compress
from protocol.errors import ErrorCode, KafkaProtocolError
from protocol.legacy import (
    convert_message_set,
    fix_lz4_header_checksum,
    is_legacy,
    xxh32_short,
)
from protocol.records import decode_batch
from tests.unit.protocol import _kafka_codecs

MESSAGES = [
    (b"k0", b"v0"),
    (None, b"value without key"),
    (b"key without value", None),
    (b"big", b"x" * 5000),
]


@pytest.fixture(autouse=True)
def _codecs(monkeypatch: pytest.MonkeyPatch) -> None:
    _kafka_codecs.install(monkeypatch)


def _bytes_field(data: bytes | None) -> bytes:
    return struct.pack(">i", -1) if data is None else struct.pack(">i", len(data)) + data


def message(
    magic: int,
    key: bytes | None,
    value: bytes | None,
    *,
    ts: int = 0,
    attrs: int = 0,
    offset: int = 0,
) -> bytes:
    body = struct.pack(">bb", magic, attrs)
    if magic == 1:
        body += struct.pack(">q", ts)
    body += _bytes_field(key) + _bytes_field(value)
    msg = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", offset, len(msg)) + msg


def _decode_all(buf: bytes) -> list[tuple[int, int, int, bytes | None, bytes | None]]:
    """(codec, offset, timestamp, key, value) over every batch; checks CRC-32C."""
    out = []
    for hdr, view in iter_batches(memoryview(buf)):
        assert verify_crc(view, hdr)
        _, recs = decode_batch(view, check_crc=True)
        out += [(hdr.compression, r.offset, r.timestamp, r.key, r.value) for r in recs]
    return out


def _kafka_python_set(magic: int, codec: int) -> bytes:
    b = LegacyRecordBatchBuilder(magic, codec, 1 << 20)
    for i, (k, v) in enumerate(MESSAGES):
        b.append(i, 1_600_000_000_000 + i, k, v)
    return bytes(b.build())


# magic-0 LZ4 needs xxhash in kafka-python: covered by a hand-built set further down
@pytest.mark.parametrize(
    ("magic", "codec"), [(m, c) for m in (0, 1) for c in range(4) if (m, c) != (0, 3)]
)
def test_converts_kafka_python_message_sets(magic: int, codec: int) -> None:
    legacy = _kafka_python_set(magic, codec)
    assert is_legacy(legacy)
    # kafka-python's own reader accepts the input (valid legacy CRCs)
    assert all(b.validate_crc() for b in iter(MemoryRecords(legacy).next_batch, None))
    out = convert_message_set(memoryview(legacy), base_offset_hint=500)
    assert not is_legacy(out)
    ts = [1_600_000_000_000 + i if magic == 1 else -1 for i in range(len(MESSAGES))]
    assert _decode_all(out) == [(codec, 500 + i, ts[i], k, v) for i, (k, v) in enumerate(MESSAGES)]
    # kafka-python reads the converted batches and validates their CRC-32C
    mr = MemoryRecords(out)
    batches = list(iter(mr.next_batch, None))
    assert len(batches) == 1 and batches[0].validate_crc()
    assert [(r.key, r.value) for r in batches[0]] == MESSAGES


def test_mixed_wrappers_and_plain_messages_become_several_batches() -> None:
    inner_gz = message(1, b"a", b"1", ts=10) + message(1, b"b", b"2", ts=11, offset=1)
    inner_zs = message(1, b"c", b"3", ts=12)
    buf = (
        message(1, b"p0", b"plain0", ts=5)
        + message(0, b"p1", b"plain1")
        + message(
            1, None, compress(Compression.GZIP, inner_gz), ts=11, attrs=Compression.GZIP, offset=3
        )
        + message(1, b"p2", b"plain2", ts=13)
        + message(1, None, compress(Compression.SNAPPY, inner_zs), ts=12, attrs=Compression.SNAPPY)
    )
    out = convert_message_set(buf, base_offset_hint=100)
    hdrs = [h for h, _ in iter_batches(memoryview(out))]
    assert [(h.base_offset, h.record_count, h.compression) for h in hdrs] == [
        (100, 2, 0),
        (102, 2, 1),
        (104, 1, 0),
        (105, 1, 2),
    ]
    assert _decode_all(out) == [
        (0, 100, 5, b"p0", b"plain0"),
        (0, 101, -1, b"p1", b"plain1"),
        (1, 102, 10, b"a", b"1"),
        (1, 103, 11, b"b", b"2"),
        (0, 104, 13, b"p2", b"plain2"),
        (2, 105, 12, b"c", b"3"),
    ]


def test_log_append_time_wrapper_stamps_inner_messages() -> None:
    inner = message(1, b"a", b"1", ts=10) + message(1, b"b", b"2", ts=11)
    wrapper = message(
        1, None, compress(Compression.GZIP, inner), ts=777, attrs=Compression.GZIP | 0x08
    )
    assert [r[2] for r in _decode_all(convert_message_set(wrapper))] == [777, 777]


def test_xxh32_matches_lz4_frame_header_checksums() -> None:
    # cramjam writes spec-correct frame headers: our XXH32 must reproduce their HC byte
    for data in (b"", b"abc", bytes(200_000)):
        frame = bytes(cramjam.lz4.compress(data))
        assert fix_lz4_header_checksum(frame) == frame
        assert (xxh32_short(frame[4:6]) >> 8) & 0xFF == frame[6]
    assert xxh32_short(b"") == 0x02CC5D05  # published XXH32 test vector (seed 0)


def test_magic0_lz4_with_old_kafka_header_checksum() -> None:
    inner = message(0, b"a", b"1") + message(0, b"b", b"2")
    frame = bytearray(_kafka_codecs.lz4_frame_independent(inner))
    wrong_hc = (xxh32_short(bytes(frame[0:6])) >> 8) & 0xFF  # Kafka 0.8/0.9 included magic
    assert wrong_hc != frame[6]
    frame[6] = wrong_hc
    wrapper = message(0, None, bytes(frame), attrs=Compression.LZ4)
    assert _decode_all(convert_message_set(wrapper)) == [
        (3, 0, -1, b"a", b"1"),
        (3, 1, -1, b"b", b"2"),
    ]
    # magic 1 must have a correct checksum
    inner1 = message(1, b"a", b"1")
    frame1 = bytearray(_kafka_codecs.lz4_frame_independent(inner1))
    frame1[6] = (xxh32_short(bytes(frame1[0:6])) >> 8) & 0xFF
    with pytest.raises(KafkaProtocolError) as err:
        convert_message_set(message(1, None, bytes(frame1), attrs=Compression.LZ4))
    assert err.value.code is ErrorCode.CORRUPT_MESSAGE


def test_is_legacy() -> None:
    assert is_legacy(message(0, b"k", b"v"))
    assert is_legacy(message(1, b"k", b"v"))
    assert not is_legacy(b"\x00" * 16)
    assert not is_legacy(b"")
    v2 = bytearray(message(1, b"k", b"v"))
    v2[16] = 2
    assert not is_legacy(v2)


def test_empty_message_set() -> None:
    assert convert_message_set(b"") == b""


def _corrupt_code(buf: bytes) -> ErrorCode:
    with pytest.raises(KafkaProtocolError) as err:
        convert_message_set(buf)
    return err.value.code


def test_crc_mismatch() -> None:
    buf = bytearray(message(1, b"key", b"value"))
    buf[-1] ^= 1
    assert _corrupt_code(bytes(buf)) is ErrorCode.CORRUPT_MESSAGE
    inner = bytearray(message(0, b"a", b"1"))
    inner[-1] ^= 1
    wrapper = message(0, None, compress(Compression.GZIP, bytes(inner)), attrs=1)
    assert _corrupt_code(wrapper) is ErrorCode.CORRUPT_MESSAGE


@pytest.mark.parametrize(
    "buf",
    [
        message(1, b"k", b"v")[:-1],  # truncated message
        message(1, b"k", b"v")[:10],  # truncated entry header
        message(1, b"k", b"v") + b"\x00" * 5,  # trailing partial entry
        message(1, None, b"not gzip", attrs=1),  # corrupt compressed value
        message(1, None, None, attrs=1),  # wrapper without value
        message(
            1,
            None,
            compress(1, message(1, None, compress(1, message(1, b"a", b"b")), attrs=1)),
            attrs=1,
        ),  # nested compression
    ],
)
def test_malformed_message_sets(buf: bytes) -> None:
    assert _corrupt_code(buf) is ErrorCode.CORRUPT_MESSAGE


def _with_size(msg: bytes, size: int) -> bytes:
    return msg[:8] + struct.pack(">i", size) + msg[12:]


def test_bad_sizes_and_fields() -> None:
    m = message(1, b"k", b"v")
    assert _corrupt_code(_with_size(m, -1)) is ErrorCode.CORRUPT_MESSAGE
    assert _corrupt_code(_with_size(m, 3)) is ErrorCode.CORRUPT_MESSAGE
    assert _corrupt_code(_with_size(m, 1 << 30)) is ErrorCode.CORRUPT_MESSAGE
    # key length field pointing past the message, with a valid CRC over it
    body = struct.pack(">bbq", 1, 0, 0) + struct.pack(">i", 100) + b"k"
    raw = struct.pack(">I", zlib.crc32(body)) + body
    assert _corrupt_code(struct.pack(">qi", 0, len(raw)) + raw) is ErrorCode.CORRUPT_MESSAGE
    # bytes left over after the value
    body = struct.pack(">bb", 0, 0) + _bytes_field(b"k") + _bytes_field(b"v") + b"xx"
    raw = struct.pack(">I", zlib.crc32(body)) + body
    assert _corrupt_code(struct.pack(">qi", 0, len(raw)) + raw) is ErrorCode.CORRUPT_MESSAGE


def test_bad_magic_inside_set() -> None:
    body = struct.pack(">bb", 2, 0) + _bytes_field(b"k") + _bytes_field(b"v")
    raw = struct.pack(">I", zlib.crc32(body)) + body
    buf = message(1, b"a", b"b") + struct.pack(">qi", 0, len(raw)) + raw
    assert _corrupt_code(buf) is ErrorCode.CORRUPT_MESSAGE


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_codec(codec: int) -> None:
    buf = message(1, None, b"whatever", attrs=codec)
    assert _corrupt_code(buf) is ErrorCode.UNSUPPORTED_COMPRESSION_TYPE


def test_converted_batches_read_by_kafka_python_default_batch() -> None:
    legacy = _kafka_python_set(1, Compression.GZIP)
    out = convert_message_set(legacy)
    ref = DefaultRecordBatch(out)
    assert ref.validate_crc() and ref.compression_type == Compression.GZIP
    assert [r.timestamp for r in ref] == [1_600_000_000_000 + i for i in range(4)]
