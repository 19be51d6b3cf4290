from __future__ import annotations

import struct
import warnings

import cramjam
import pyarrow as pa
import pytest

from ingest_job.decode import RAW_SCHEMA, Columns, RecordDecodeError, decode_batch_into
from protocol.batch import CRC_START, crc32c, read_header
from protocol.compression import Compression
from protocol.records import build_batch

with warnings.catch_warnings():  # kafka-python 3.0.12 uses importlib.resources.read_text
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatchBuilder

TS = 1_700_000_000_000


def _records(n: int) -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]]:
    out: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]] = []
    for i in range(n):
        key = None if i % 4 == 0 else f"key-{i}".encode()
        value = None if i % 5 == 4 else (f"value-{i}-" * (i % 9 + 1)).encode()
        headers: list[tuple[str, bytes | None]] = [("a", b"1"), ("b", None)] if i % 2 else []
        out.append((key, value, headers))
    return out


def _decode(batch: bytes, start: int = 0, end: int = 1 << 62) -> pa.RecordBatch:
    cols = Columns("t", 3)
    view = memoryview(batch)
    decode_batch_into(cols, read_header(view), view, start, end)
    return cols.to_arrow()


@pytest.mark.parametrize("codec", list(Compression))
def test_every_codec_round_trips(codec: Compression) -> None:
    recs = _records(40)
    tss = [TS + i * 10 for i in range(40)]
    batch = build_batch(recs, base_offset=1000, compression=codec, timestamps=tss)
    out = _decode(batch)
    assert out.schema == RAW_SCHEMA
    rows = out.to_pylist()
    assert [r["offset"] for r in rows] == list(range(1000, 1040))
    assert [r["key"] for r in rows] == [k for k, _v, _h in recs]
    assert [r["value"] for r in rows] == [v for _k, v, _h in recs]
    assert [[(h["key"], h["value"]) for h in r["headers"]] for r in rows] == [h for *_x, h in recs]
    assert [int(r["timestamp"].timestamp() * 1000) for r in rows] == tss
    assert {r["topic"] for r in rows} == {"t"} and {r["partition"] for r in rows} == {3}
    assert {r["timestamp_type"] for r in rows} == {0}


def test_offset_window_and_log_append_time() -> None:
    batch = build_batch(_records(10), base_offset=50, log_append_time=True, timestamps=[TS] * 10)
    hdr = read_header(batch)
    out = _decode(batch, start=53, end=57).to_pylist()
    assert [r["offset"] for r in out] == [53, 54, 55, 56]
    assert {r["timestamp_type"] for r in out} == {1}
    assert {int(r["timestamp"].timestamp() * 1000) for r in out} == {hdr.max_timestamp}


def test_control_batches_are_skipped() -> None:
    batch = build_batch([(b"\x00\x00\x00\x00", b"", [])], base_offset=5, control=True)
    assert _decode(batch).num_rows == 0


def test_batch_from_kafka_python_builder() -> None:
    """An independent encoder (kafka-python's) decodes to the same records."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 30,
    )  # fmt: skip
    for i in range(20):
        builder.append(i, timestamp=TS + i, key=b"k%d" % i, value=b"v" * i, headers=[("x", b"y")])
    buf = bytes(builder.build())
    rows = _decode(buf).to_pylist()
    assert [r["value"] for r in rows] == [b"v" * i for i in range(20)]
    assert rows[7]["key"] == b"k7" and rows[7]["headers"] == [{"key": "x", "value": b"y"}]


def _with_records_section(batch: bytes, codec: int, section: bytes) -> bytes:
    """Rebuild a batch around a replacement records section (CRC and length fixed)."""
    head = bytearray(batch[:61])
    struct.pack_into(">i", head, 8, 61 - 12 + len(section))
    attrs = (struct.unpack_from(">h", head, 21)[0] & ~7) | codec
    struct.pack_into(">h", head, 21, attrs)
    out = bytearray(head + section)
    struct.pack_into(">I", out, 17, crc32c(memoryview(out)[CRC_START:]))
    return bytes(out)


def test_raw_snappy_block_without_xerial_framing() -> None:
    plain = build_batch(_records(12), base_offset=0)
    section = bytes(cramjam.snappy.compress_raw(plain[61:]))
    batch = _with_records_section(plain, 2, section)
    assert _decode(batch).to_pylist() == _decode(plain).to_pylist()


def test_bad_crc_names_the_offset() -> None:
    batch = bytearray(build_batch(_records(3), base_offset=77))
    batch[-1] ^= 0xFF
    with pytest.raises(RecordDecodeError, match="offset 77.*CRC"):
        _decode(bytes(batch))


def test_garbled_compressed_section_is_a_decode_error() -> None:
    plain = build_batch(_records(3), base_offset=9)
    batch = _with_records_section(plain, 4, b"not zstd at all")
    with pytest.raises(RecordDecodeError, match="offset 9"):
        _decode(batch)


def test_record_overrunning_its_length_is_rejected() -> None:
    plain = build_batch([(b"k", b"value", [])], base_offset=0)
    section = bytearray(plain[61:])
    section[0] = 2  # length varint (zig-zag 1) shorter than the record
    with pytest.raises(RecordDecodeError):
        _decode(_with_records_section(plain, 0, bytes(section)))


def test_many_batches_in_one_call_match_one_by_one() -> None:
    from ingest_job.decode import decode_batches_into

    batches = [
        build_batch(_records(7), base_offset=7 * i, compression=Compression(i % 5))
        for i in range(6)
    ]
    cols = Columns("t", 3)
    refs = [(read_header(b), memoryview(b)) for b in batches]
    assert decode_batches_into(cols, refs, 3, 40) == 37
    one_call = cols.to_arrow().to_pylist()
    assert [r["offset"] for r in one_call] == list(range(3, 40))
    by_one = [r for b in batches for r in _decode(b, 3, 40).to_pylist()]
    assert one_call == by_one


def test_bad_batch_among_many_is_named() -> None:
    from ingest_job.decode import decode_batches_into

    good = build_batch(_records(3), base_offset=0)
    plain = build_batch([(b"k", b"value", [])], base_offset=3)
    section = bytearray(plain[61:])
    section[0] = 2  # record length shorter than the record
    bad = _with_records_section(plain, 0, bytes(section))
    refs = [(read_header(b), memoryview(b)) for b in (good, bad)]
    with pytest.raises(RecordDecodeError, match="offset 3"):
        decode_batches_into(Columns("t", 0), refs, 0, 100)


def test_header_key_that_is_not_utf8_is_kept_with_replacements() -> None:
    plain = build_batch([(b"k", b"v", [("hk", b"x")])], base_offset=0)
    batch = _with_records_section(plain, 0, plain[61:].replace(b"hk", b"h\xff"))
    rows = _decode(batch).to_pylist()
    assert rows[0]["headers"] == [{"key": "h\ufffd", "value": b"x"}]
