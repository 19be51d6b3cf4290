"""Tests for protocol.records: decode/build of v2 records against kafka-python's own code."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from protocol.batch import BATCH_HEADER_SIZE, crc32c, read_header, set_base_offset, verify_crc
from protocol.compression import Compression
from protocol.errors import ErrorCode, KafkaProtocolError
from protocol.records import (
    Record,
    build_batch,
    decode_batch,
    decode_batch_columns,
    encode_varint,
    offset_for_timestamp,
)
from tests.unit.protocol import _kafka_codecs

CODECS = list(Compression)
TS0 = 1_700_000_000_000

SAMPLE: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]] = [
    (b"key-0", b"value-0", [("trace", b"abc"), ("empty", b""), ("null", None)]),
    (None, b"no key", []),
    (b"no value", None, []),
    (None, None, [("\u00e9t\u00e9", b"\x00\xff")]),
    (b"", b"", []),
    (b"k" * 300, b"v" * 70_000, []),  # multi-byte varint lengths
]


@pytest.fixture(autouse=True)
def _codecs(monkeypatch: pytest.MonkeyPatch) -> None:
    _kafka_codecs.install(monkeypatch)


def _kafka_python_build(codec: int, base_offset: int = 0, **kw: int) -> bytes:
    b = DefaultRecordBatchBuilder(2, codec, False, kw.get("pid", -1), -1, -1, 1 << 24)
    for i, (k, v, h) in enumerate(SAMPLE):
        b.append(i, TS0 + 7 * i - (3000 if i == 2 else 0), k, v, h)
    raw = bytearray(b.build())
    set_base_offset(raw, base_offset)
    return bytes(raw)


def _as_tuples(records: list[Record]) -> list[tuple[object, ...]]:
    return [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in records]


@pytest.mark.parametrize("codec", CODECS)
def test_decodes_kafka_python_batches(codec: Compression) -> None:
    raw = _kafka_python_build(codec, base_offset=1000)
    expected = [
        (r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in DefaultRecordBatch(raw)
    ]
    hdr, records = decode_batch(raw, check_crc=True)
    assert hdr.compression == codec and hdr.record_count == len(SAMPLE)
    assert _as_tuples(records) == expected
    assert records[0].offset == 1000 and records[2].timestamp == TS0 + 14 - 3000
    assert records[3].headers == (("\u00e9t\u00e9", b"\x00\xff"),)


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_decodes_our_batches(codec: Compression) -> None:
    ts = [TS0 + 7 * i for i in range(len(SAMPLE))]
    ts[2] -= 3000  # a negative timestamp delta
    raw = build_batch(
        SAMPLE,
        base_offset=42,
        compression=codec,
        timestamps=ts,
        producer_id=9,
        producer_epoch=2,
        base_sequence=17,
    )
    ref = DefaultRecordBatch(raw)
    assert ref.validate_crc()
    assert ref.compression_type == codec
    assert (ref.producer_id, ref.producer_epoch, ref.base_sequence) == (9, 2, 17)
    assert ref.max_timestamp == max(ts) and ref.first_timestamp == ts[0]
    got = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in ref]
    assert got == [(42 + i, ts[i], k, v, list(h)) for i, (k, v, h) in enumerate(SAMPLE)]
    # and MemoryRecords frames two of them back to back
    mr = MemoryRecords(raw + raw)
    assert sum(1 for _ in iter(mr.next_batch, None)) == 2


def test_build_is_byte_identical_to_kafka_python_uncompressed() -> None:
    b = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 24)
    for i, (k, v, h) in enumerate(SAMPLE):
        b.append(i, TS0 + i, k, v, h)
    theirs = bytes(b.build())
    ours = build_batch(
        SAMPLE, timestamps=[TS0 + i for i in range(len(SAMPLE))], partition_leader_epoch=0
    )
    assert ours == theirs


def test_build_defaults() -> None:
    raw = build_batch([(b"k", b"v", None)], base_timestamp=5)
    hdr = read_header(raw)
    assert (hdr.base_offset, hdr.partition_leader_epoch, hdr.magic) == (0, -1, 2)
    assert (hdr.producer_id, hdr.producer_epoch, hdr.base_sequence) == (-1, -1, -1)
    assert (hdr.base_timestamp, hdr.max_timestamp, hdr.record_count) == (5, 5, 1)
    assert hdr.size == len(raw) and verify_crc(raw)
    assert not hdr.is_transactional
    assert read_header(build_batch([(b"k", b"v", None)], transactional=True)).is_transactional
    with pytest.raises(ValueError):
        build_batch([])
    with pytest.raises(ValueError):
        build_batch([(b"k", b"v", None)], timestamps=[1, 2])


def test_log_append_time_uses_max_timestamp() -> None:
    raw = bytearray(
        build_batch(
            [(b"a", b"1", None), (b"b", b"2", None)], timestamps=[10, 20], log_append_time=True
        )
    )
    # the broker would stamp maxTimestamp; CRC covers it, so recompute it here
    struct.pack_into(">q", raw, 35, 999)
    struct.pack_into(">I", raw, 17, crc32c(memoryview(raw)[21:]))
    _, recs = decode_batch(raw, check_crc=True)
    assert [r.timestamp for r in recs] == [999, 999]
    assert [r.timestamp for r in DefaultRecordBatch(bytes(raw))] == [999, 999]


@pytest.mark.parametrize("codec", CODECS)
def test_columns_match_records(codec: Compression) -> None:
    raw = _kafka_python_build(codec, base_offset=7)
    hdr, records = decode_batch(memoryview(raw))
    cols = decode_batch_columns(memoryview(raw))
    assert cols.header == hdr and len(cols) == len(records)
    assert cols.offsets == [r.offset for r in records]
    assert cols.timestamps == [r.timestamp for r in records]
    assert cols.keys == [r.key for r in records]
    assert cols.values == [r.value for r in records]
    assert cols.headers == [r.headers for r in records]


def test_decode_reads_only_the_first_batch_of_a_larger_buffer() -> None:
    a = build_batch([(b"a", b"1", None)], base_offset=0)
    b = build_batch([(b"b", b"2", None)], base_offset=1)
    _, recs = decode_batch(a + b)
    assert [r.key for r in recs] == [b"a"]


def test_offset_for_timestamp() -> None:
    raw = build_batch(
        [(None, b"%d" % i, None) for i in range(5)],
        base_offset=100,
        timestamps=[50, 10, 30, 30, 40],
    )
    assert offset_for_timestamp(raw, 0) == 100
    assert offset_for_timestamp(raw, 50) == 100
    assert offset_for_timestamp(raw, 11) == 100  # first by offset with ts >= 11
    assert offset_for_timestamp(raw, 51) is None
    raw2 = build_batch([(None, b"x", None)] * 4, base_offset=5, timestamps=[1, 2, 3, 4])
    assert offset_for_timestamp(raw2, 3) == 7
    assert offset_for_timestamp(raw2, -1) == 5
    assert offset_for_timestamp(raw2, 5) is None
    lat = build_batch(
        [(None, b"x", None)] * 3, base_offset=9, timestamps=[1, 2, 3], log_append_time=True
    )
    assert offset_for_timestamp(lat, 3) == 9
    assert offset_for_timestamp(lat, 4) is None


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, "00"),
        (-1, "01"),
        (1, "02"),
        (63, "7e"),
        (-64, "7f"),
        (64, "8001"),
        (300, "d804"),
        (-(2**63), "ffffffffffffffffff01"),
        (2**63 - 1, "feffffffffffffffff01"),
    ],
)
def test_zigzag_varint_vectors(value: int, encoded: str) -> None:
    out = bytearray()
    encode_varint(value, out)
    assert out.hex() == encoded


def test_extreme_offsets_and_timestamps_round_trip() -> None:
    big = 2**62
    raw = build_batch(
        [(b"k", b"v", None), (b"k2", None, None)], base_offset=big, timestamps=[-(2**40), 2**45]
    )
    _, recs = decode_batch(raw)
    assert [(r.offset, r.timestamp) for r in recs] == [(big, -(2**40)), (big + 1, 2**45)]


# ----------------------------------------------------------------- malformed records


def _uncompressed_with_body(body: bytes, count: int) -> bytes:
    """An otherwise valid batch header around an arbitrary records section."""
    raw = bytearray(build_batch([(b"k", b"v", None)]))
    raw = raw[:BATCH_HEADER_SIZE] + body
    struct.pack_into(">i", raw, 8, len(raw) - 12)
    struct.pack_into(">i", raw, 57, count)
    struct.pack_into(">I", raw, 17, crc32c(memoryview(raw)[21:]))
    return bytes(raw)


def _record(body: bytes) -> bytes:
    out = bytearray()
    encode_varint(len(body), out)
    return bytes(out) + body


GOOD_BODY = b"\x00\x00\x00" + b"\x02k" + b"\x02v" + b"\x00"  # attrs ts off key val hdrs

MALFORMED = {
    "count too high": _uncompressed_with_body(_record(GOOD_BODY), 2),
    "count too low": _uncompressed_with_body(_record(GOOD_BODY) * 2, 1),
    "length too short": _uncompressed_with_body(b"\x0c" + GOOD_BODY, 1),
    "length too long": _uncompressed_with_body(b"\x12" + GOOD_BODY + b"\x00", 1),
    "trailing byte": _uncompressed_with_body(_record(GOOD_BODY) + b"\x00", 1),
    "negative length": _uncompressed_with_body(b"\x03" + GOOD_BODY, 1),
    "key past end": _uncompressed_with_body(_record(b"\x00\x00\x00\x40k"), 1),
    "key length -2": _uncompressed_with_body(_record(b"\x00\x00\x00\x03\x02v\x00"), 1),
    "value length -3": _uncompressed_with_body(_record(b"\x00\x00\x00\x02k\x05\x00"), 1),
    "negative header count": _uncompressed_with_body(_record(GOOD_BODY[:-1] + b"\x01"), 1),
    "header key -1": _uncompressed_with_body(_record(GOOD_BODY[:-1] + b"\x02\x01\x00"), 1),
    "header value -2": _uncompressed_with_body(_record(GOOD_BODY[:-1] + b"\x02\x02h\x03"), 1),
    "bad utf-8 key": _uncompressed_with_body(_record(GOOD_BODY[:-1] + b"\x02\x02\xff\x00"), 1),
    "header past end": _uncompressed_with_body(_record(GOOD_BODY[:-1] + b"\x04\x02h\x00"), 1),
    "varint too long": _uncompressed_with_body(b"\xff" * 12 + b"\x01", 1),
    "empty body": _uncompressed_with_body(b"", 1),
    "negative count": _uncompressed_with_body(_record(GOOD_BODY), -1),
}


def test_good_body_is_valid() -> None:
    _, recs = decode_batch(_uncompressed_with_body(_record(GOOD_BODY), 1), check_crc=True)
    assert [(r.key, r.value, r.headers) for r in recs] == [(b"k", b"v", ())]


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_records_raise_corrupt_message(name: str) -> None:
    with pytest.raises(KafkaProtocolError) as err:
        decode_batch(MALFORMED[name])
    assert err.value.code is ErrorCode.CORRUPT_MESSAGE
    with pytest.raises(KafkaProtocolError):
        decode_batch_columns(MALFORMED[name])


def test_malformed_framing() -> None:
    raw = build_batch([(b"k", b"v", None)])
    for bad in (raw[:60], raw[:-1], b"\x00" * 16 + b"\x01" + raw[17:]):
        with pytest.raises(KafkaProtocolError) as err:
            decode_batch(bad)
        assert err.value.code is ErrorCode.CORRUPT_MESSAGE
    flipped = bytearray(raw)
    flipped[-2] ^= 1
    decode_batch(flipped)  # CRC is only checked on request
    with pytest.raises(KafkaProtocolError, match="CRC"):
        decode_batch(flipped, check_crc=True)


def test_unknown_codec_in_attributes() -> None:
    raw = bytearray(build_batch([(b"k", b"v", None)]))
    struct.pack_into(">h", raw, 21, 6)
    with pytest.raises(KafkaProtocolError) as err:
        decode_batch(raw)
    assert err.value.code is ErrorCode.UNSUPPORTED_COMPRESSION_TYPE


# ------------------------------------------------------------------------ properties

header_st = st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8))
record_st = st.tuples(
    st.none() | st.binary(max_size=40),
    st.none() | st.binary(max_size=300),
    st.lists(header_st, max_size=3),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(record_st, min_size=1, max_size=20),
    codec=st.sampled_from(CODECS),
    base_offset=st.integers(0, 2**62),
    ts0=st.integers(-1, 2**42),
    ts_deltas=st.lists(st.integers(-(2**31), 2**31), min_size=20, max_size=20),
)
def test_property_build_decode_round_trip(
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
    codec: Compression,
    base_offset: int,
    ts0: int,
    ts_deltas: list[int],
) -> None:
    ts = [ts0 + d for d in ts_deltas[: len(records)]]
    raw = build_batch(records, base_offset=base_offset, compression=codec, timestamps=ts)
    hdr, decoded = decode_batch(raw, check_crc=True)
    assert hdr.record_count == len(records) and hdr.last_offset == base_offset + len(records) - 1
    assert hdr.max_timestamp == max(ts)
    assert _as_tuples(decoded) == [
        (base_offset + i, ts[i], k, v, h) for i, (k, v, h) in enumerate(records)
    ]
    ref = DefaultRecordBatch(raw)  # kafka-python agrees
    assert ref.validate_crc()
    assert [(r.key, r.value, r.headers) for r in ref] == [tuple(r) for r in records]
