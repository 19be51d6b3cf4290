"""Tests for protocol.batch: header view, CRC-32C, in-place patches, batch framing."""

from __future__ import annotations

import struct

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from protocol.batch import (
    BATCH_HEADER_SIZE,
    CorruptBatchError,
    crc32c,
    iter_batches,
    read_header,
    set_base_offset,
    set_leader_epoch,
    verify_crc,
)
from protocol.compression import Compression
from protocol.records import build_batch, decode_batch


def _kafka_python_batch(n: int = 3, codec: int = 0, transactional: bool = False) -> bytes:
    b = DefaultRecordBatchBuilder(2, codec, transactional, 77, 3, 10, 1 << 20)
    for i in range(n):
        b.append(i, 1_700_000_000_000 + 5 * i, b"k%d" % i, b"value-%d" % i, [("h", b"x")])
    return bytes(b.build())


def test_crc32c_known_vector() -> None:
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"56789", crc32c(b"1234")) == 0xE3069283


def test_read_header_matches_kafka_python() -> None:
    raw = _kafka_python_batch(4, Compression.GZIP, transactional=True)
    ref = DefaultRecordBatch(raw)
    hdr = read_header(raw)
    assert hdr.base_offset == ref.base_offset
    assert hdr.size == len(raw) == ref.size_in_bytes
    assert hdr.magic == 2
    assert hdr.crc == ref.crc
    assert hdr.last_offset_delta == 3 and hdr.last_offset == ref.last_offset
    assert hdr.base_timestamp == ref.first_timestamp == 1_700_000_000_000
    assert hdr.max_timestamp == ref.max_timestamp == 1_700_000_000_015
    assert (hdr.producer_id, hdr.producer_epoch, hdr.base_sequence) == (77, 3, 10)
    assert hdr.record_count == 4
    assert hdr.compression == Compression.GZIP
    assert hdr.is_transactional and not hdr.is_control
    assert hdr.timestamp_type == 0


def test_attribute_flags() -> None:
    raw = build_batch([(b"k", b"v", None)], log_append_time=True, control=True)
    hdr = read_header(raw)
    assert hdr.timestamp_type == 1 and hdr.is_control and not hdr.is_transactional
    assert hdr.compression == Compression.NONE


def test_read_header_at_position_and_truncated() -> None:
    raw = _kafka_python_batch()
    assert read_header(b"\x00" * 5 + raw, 5) == read_header(raw)
    with pytest.raises(CorruptBatchError):
        read_header(raw[: BATCH_HEADER_SIZE - 1])
    with pytest.raises(CorruptBatchError):
        read_header(raw, len(raw) - 10)


def test_verify_crc_detects_any_covered_byte_flip() -> None:
    raw = _kafka_python_batch()
    assert verify_crc(raw)
    for pos in (21, 30, BATCH_HEADER_SIZE, len(raw) - 1):
        bad = bytearray(raw)
        bad[pos] ^= 0x40
        assert not verify_crc(bad), pos


def test_verify_crc_ignores_trailing_bytes_beyond_batch() -> None:
    raw = _kafka_python_batch()
    assert verify_crc(raw + b"garbage")


def test_set_base_offset_and_epoch_keep_crc_valid() -> None:
    raw = bytearray(_kafka_python_batch())
    set_base_offset(raw, 123_456_789_012)
    set_leader_epoch(memoryview(raw), 42)
    hdr = read_header(raw)
    assert hdr.base_offset == 123_456_789_012
    assert hdr.partition_leader_epoch == 42
    assert verify_crc(raw)
    ref = DefaultRecordBatch(bytes(raw))
    assert ref.validate_crc()
    assert [r.offset for r in ref] == [123_456_789_012 + i for i in range(3)]
    _, recs = decode_batch(raw, check_crc=True)
    assert [r.offset for r in recs] == [123_456_789_012 + i for i in range(3)]


def test_iter_batches_splits_views_without_copy() -> None:
    a = _kafka_python_batch(2)
    b = build_batch([(None, b"x" * 100, None)], base_offset=2, compression=Compression.ZSTD)
    buf = bytearray(a + b)
    view = memoryview(buf)
    out = list(iter_batches(view))
    assert [h.base_offset for h, _ in out] == [0, 2]
    assert [bytes(v) for _, v in out] == [a, b]
    # views share memory with the input: patching the view patches the buffer
    set_base_offset(out[1][1], 99)
    assert read_header(buf, len(a)).base_offset == 99


def test_iter_batches_empty() -> None:
    assert list(iter_batches(memoryview(b""))) == []


def test_iter_batches_truncated_batch() -> None:
    raw = _kafka_python_batch() * 2
    with pytest.raises(CorruptBatchError):
        list(iter_batches(memoryview(raw[:-1])))
    with pytest.raises(CorruptBatchError):  # truncated header of the second batch
        list(iter_batches(memoryview(raw[: len(raw) // 2 + 30])))


def test_iter_batches_bad_magic() -> None:
    raw = bytearray(_kafka_python_batch())
    raw[16] = 1
    with pytest.raises(CorruptBatchError, match="magic"):
        list(iter_batches(memoryview(raw)))


@pytest.mark.parametrize("length", [-12, -1, 0, BATCH_HEADER_SIZE - 13, 1 << 30])
def test_iter_batches_bad_length(length: int) -> None:
    raw = bytearray(_kafka_python_batch())
    struct.pack_into(">i", raw, 8, length)
    with pytest.raises(CorruptBatchError):
        list(iter_batches(memoryview(raw)))


def _by_headers(buf: bytes) -> bool | None:
    """The definition ``any_transactional`` must agree with: every header parsed (a
    broken batch anywhere: None)."""
    try:
        headers = [h for h, _ in iter_batches(memoryview(buf))]
    except CorruptBatchError:
        return None
    return any(h.is_transactional for h in headers)


def test_any_transactional_agrees_with_parsing_every_header() -> None:
    from protocol.batch import any_transactional

    plain = build_batch([(b"k", b"v", [])] * 2)
    txn = build_batch([(b"k", b"v", [])], base_offset=2, producer_id=7, producer_epoch=0,
                      base_sequence=0, transactional=True)  # fmt: skip
    bad_magic = bytearray(plain)
    bad_magic[16] = 1
    short_len = bytearray(plain)
    struct.pack_into(">i", short_len, 8, 10)
    cases = {
        "empty": b"",
        "plain": plain,
        "two plain": plain + plain,
        "txn second": plain + txn,
        "txn first": txn + plain,
        "truncated after a txn": txn + plain[:40],
        "txn then a partial batch": txn + plain[:-1],
        "bad magic after a txn": txn + bytes(bad_magic),
        "length under a header": bytes(short_len),
    }
    got = {name: any_transactional(buf) for name, buf in cases.items()}
    assert got == {name: _by_headers(buf) for name, buf in cases.items()}
    assert got["txn second"] is True and got["plain"] is False
    assert got["truncated after a txn"] is None and got["bad magic after a txn"] is None
