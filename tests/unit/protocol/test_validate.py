"""protocol.validate: what the broker checks before it acknowledges a batch.

Each malformed case gets its exact Kafka error; the property tests check that whatever
the validator accepts decodes fully with the ingest job's decoders (protocol.fastrecords,
native and pure Python), with the recomputed maxTimestamp.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest_job.decode import Columns, decode_batch_into
from protocol import validate as v
from protocol.batch import BATCH_HEADER_SIZE, crc32c, read_header, verify_crc
from protocol.compression import Compression
from protocol.errors import ErrorCode
from protocol.fastrecords import decode_buffers, decode_python
from protocol.records import build_batch

TS0 = 1_700_000_000_000
#: record indexes and messages come from the native scanner; without it (the pure-Python
#: fallback) the verdicts are the same (test_pure_python_scan_agrees_with_the_native_one)
native_details = pytest.mark.skipif(v.native_scan is None, reason="native scan not built")


def _recrc(batch: bytearray) -> bytearray:
    struct.pack_into(">I", batch, 17, crc32c(memoryview(batch)[21:]))
    return batch


def _check(batch: bytes | bytearray, policy: v.TimestampPolicy = v.DEFAULT_POLICY) -> v.BatchHeader:
    buf = bytearray(batch)
    return v.validate_batch(read_header(buf), memoryview(buf), policy, TS0)


def _rejected(
    batch: bytes | bytearray, policy: v.TimestampPolicy = v.DEFAULT_POLICY
) -> v.BatchRejected:
    with pytest.raises(v.BatchRejected) as info:
        _check(batch, policy)
    return info.value


def _three(**kw: object) -> bytearray:
    recs = [(b"k%d" % i, b"value-%d" % i, [("h", b"x")]) for i in range(3)]
    return bytearray(build_batch(recs, base_timestamp=TS0, **kw))  # type: ignore[arg-type]


def test_good_batch_passes_unchanged() -> None:
    batch = _three()
    hdr = _check(batch)
    assert hdr == read_header(batch)


@pytest.mark.parametrize("codec", [c for c in Compression if c])
def test_good_compressed_batch_passes(codec: Compression) -> None:
    assert _check(_three(compression=codec)).record_count == 3


def test_bad_crc() -> None:
    batch = _three()
    batch[-1] ^= 1
    assert _rejected(batch).code == ErrorCode.CORRUPT_MESSAGE


@native_details
def test_huge_count_with_valid_crc() -> None:
    batch = _three()
    struct.pack_into(">i", batch, 23, 92_341_797)
    struct.pack_into(">i", batch, 57, 92_341_798)
    exc = _rejected(_recrc(batch))
    assert exc.code == ErrorCode.INVALID_RECORD
    assert exc.record_index == 3  # the first record that is missing


@native_details
def test_count_below_records_present() -> None:
    batch = _three()
    struct.pack_into(">i", batch, 23, 1)
    struct.pack_into(">i", batch, 57, 2)
    exc = _rejected(_recrc(batch))
    assert exc.code == ErrorCode.INVALID_RECORD and "more record bytes" in exc.message


def test_last_offset_delta_disagrees_with_count() -> None:
    batch = _three()
    struct.pack_into(">i", batch, 23, 7)
    assert _rejected(_recrc(batch)).code == ErrorCode.INVALID_RECORD


def test_zero_count() -> None:
    batch = _three()
    struct.pack_into(">i", batch, 23, -1)
    struct.pack_into(">i", batch, 57, 0)
    assert _rejected(_recrc(batch)).code == ErrorCode.INVALID_RECORD


@native_details
def test_record_length_lies() -> None:
    batch = _three()
    batch[BATCH_HEADER_SIZE] += 2  # first record's length varint (small, one byte)
    exc = _rejected(_recrc(batch))
    assert exc.code == ErrorCode.INVALID_RECORD and exc.record_index == 0


def test_offset_deltas_out_of_order() -> None:
    recs: list[tuple[bytes, bytes, list[tuple[str, bytes]]]] = [(b"k", b"v", [])] * 2
    batch = bytearray(build_batch(recs, base_timestamp=TS0))
    # record layout: len, attrs, ts delta, offset delta -> 2nd record's offset delta := 0
    first_len = batch[BATCH_HEADER_SIZE] >> 1
    second = BATCH_HEADER_SIZE + 1 + first_len
    batch[second + 3] = 0
    exc = _rejected(_recrc(batch))
    assert exc.code == ErrorCode.INVALID_RECORD and exc.record_index == 1


def test_bad_compression() -> None:
    batch = _three(compression=Compression.GZIP)
    batch[BATCH_HEADER_SIZE + 12 : BATCH_HEADER_SIZE + 30] = b"\xaa" * 18
    assert _rejected(_recrc(batch)).code == ErrorCode.CORRUPT_MESSAGE


def test_compressed_count_lies() -> None:
    batch = _three(compression=Compression.ZSTD)
    struct.pack_into(">i", batch, 23, 3)
    struct.pack_into(">i", batch, 57, 4)
    assert _rejected(_recrc(batch)).code == ErrorCode.INVALID_RECORD


def test_decompression_past_the_bound() -> None:
    batch = bytearray(build_batch([(b"k", b"\0" * 100_000, [])], compression=Compression.ZSTD))
    buf = memoryview(batch)
    with pytest.raises(v.BatchRejected) as info:
        v.validate_batch(read_header(buf), buf, max_uncompressed=10_000)
    assert info.value.code == ErrorCode.CORRUPT_MESSAGE


def test_control_batch_refused() -> None:
    exc = _rejected(_three(control=True))
    assert exc.code == ErrorCode.INVALID_RECORD and "control" in exc.message


def test_transactional_batch_needs_a_producer_id() -> None:
    batch = _three(producer_id=5, producer_epoch=0, base_sequence=0, transactional=True)
    assert _check(batch).is_transactional
    assert _rejected(_three(transactional=True)).code == ErrorCode.INVALID_RECORD


@pytest.mark.parametrize(("pid", "epoch", "seq"), [(-7, -1, -1), (5, -1, 0), (5, 0, -1)])
def test_inconsistent_producer_fields(pid: int, epoch: int, seq: int) -> None:
    batch = _three(producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    assert _rejected(batch).code == ErrorCode.INVALID_RECORD


def test_idempotent_and_plain_producer_fields_pass() -> None:
    assert _check(_three(producer_id=5, producer_epoch=0, base_sequence=0)).producer_id == 5
    assert _check(_three()).producer_id == -1


def test_max_timestamp_recomputed_and_crc_fixed() -> None:
    """sarama 1.22 writes maxTimestamp = -1: the broker stores the records' maximum."""
    batch = _three(timestamps=[TS0 + 5, TS0 + 9, TS0 + 1])
    struct.pack_into(">q", batch, 35, -1)
    _recrc(batch)
    buf = memoryview(batch)
    hdr = v.validate_batch(read_header(buf), buf)
    assert hdr.max_timestamp == TS0 + 9
    assert read_header(batch).max_timestamp == TS0 + 9  # patched in place
    assert verify_crc(batch)


@pytest.mark.parametrize(
    ("configs", "offset_ms", "ok"),
    [
        ({"message.timestamp.before.max.ms": "1000"}, -5000, False),
        ({"message.timestamp.before.max.ms": "1000"}, -500, True),
        ({"message.timestamp.after.max.ms": "1000"}, 5000, False),
        ({"message.timestamp.difference.max.ms": "1000"}, 5000, False),
        ({"message.timestamp.difference.max.ms": "1000"}, -5000, False),
        ({}, -(10**9), True),
    ],
)
def test_timestamp_bounds(configs: dict[str, str], offset_ms: int, ok: bool) -> None:
    policy = v.TimestampPolicy.from_configs(configs)
    batch = bytearray(build_batch([(b"k", b"v", [])], base_timestamp=TS0 + offset_ms))
    if ok:
        _check(batch, policy)
    else:
        assert _rejected(batch, policy).code == ErrorCode.INVALID_TIMESTAMP


def test_log_append_time_topic_skips_create_time_bounds() -> None:
    policy = v.TimestampPolicy.from_configs(
        {"message.timestamp.type": "LogAppendTime", "message.timestamp.before.max.ms": "1"}
    )
    _check(build_batch([(b"k", b"v", [])], base_timestamp=1), policy)


# -- properties ----------------------------------------------------------------------------
records = st.lists(
    st.tuples(
        st.none() | st.binary(max_size=20),
        st.none() | st.binary(max_size=40),
        st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=8)), max_size=2),
    ),
    min_size=1,
    max_size=6,
)


@st.composite
def mutated_batches(draw: st.DrawFn) -> bytearray:
    recs = draw(records)
    codec = draw(st.sampled_from(list(Compression)))
    stamps = draw(st.lists(st.integers(0, 10**6), min_size=len(recs), max_size=len(recs)))
    batch = bytearray(build_batch(recs, compression=codec, timestamps=[TS0 + t for t in stamps]))
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["flip", "count", "delta", "maxts", "len"]))
        if kind == "flip" and len(batch) > BATCH_HEADER_SIZE:
            pos = draw(st.integers(BATCH_HEADER_SIZE, len(batch) - 1))
            batch[pos] ^= draw(st.integers(1, 255))
        elif kind == "count":
            struct.pack_into(">i", batch, 57, draw(st.integers(-2, 1 << 20)))
        elif kind == "delta":
            struct.pack_into(">i", batch, 23, draw(st.integers(-2, 1 << 20)))
        elif kind == "maxts":
            struct.pack_into(">q", batch, 35, draw(st.sampled_from([-1, 0, TS0])))
        elif kind == "len":
            cut = draw(st.integers(BATCH_HEADER_SIZE, len(batch)))
            del batch[cut:]
            struct.pack_into(">i", batch, 8, len(batch) - 12)
    return _recrc(batch)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=mutated_batches())
def test_accepted_batches_decode_fully(batch: bytearray) -> None:
    buf = memoryview(batch)
    try:
        hdr = v.validate_batch(read_header(buf), buf)
    except v.BatchRejected:
        return
    from protocol.compression import decompress

    section = decompress(hdr.compression, buf[BATCH_HEADER_SIZE : hdr.size])
    for decode in (decode_buffers, decode_python):
        (rb,) = decode([(section, hdr)], strict_utf8=False)
        assert rb.count == hdr.record_count
        assert rb.offset_list() == list(range(hdr.record_count))
        assert max(rb.timestamp_list()) == hdr.max_timestamp
    assert verify_crc(batch)
    cols = Columns("t", 0)  # the ingest job's own entry point, CRC check included
    assert decode_batch_into(cols, hdr, buf, 0, 1 << 62) == hdr.record_count
    assert cols.to_table().column("offset").to_pylist() == list(range(hdr.record_count))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=mutated_batches())
def test_pure_python_scan_agrees_with_the_native_one(batch: bytearray) -> None:
    """Without the C extension the broker reaches the same verdicts."""
    if v.native_scan is None:
        pytest.skip("protocol._fastrecords not built (or built before scan)")
    hdr = read_header(batch)
    if hdr.compression or hdr.size > len(batch) or hdr.record_count > 10_000:
        return
    section = bytes(batch[BATCH_HEADER_SIZE : hdr.size])
    verdicts: list[object] = []
    for scan in (v.scan_records, v._scan_python):
        try:
            verdicts.append(scan(section, hdr.record_count))
        except v.BatchRejected as exc:
            verdicts.append(exc.code)
    assert verdicts[0] == verdicts[1]
