"""protocol.fastrecords: the native decoder and the pure-Python one give identical results.

Every property/fuzz case runs both implementations (``decode_buffers`` through the C
extension and ``decode_python``) and ``fastrecords.decode_batch_columns`` against
``protocol.records.decode_batch_columns``: equal outputs, or both raise CORRUPT_MESSAGE.

The tests of the C extension itself (``native_decoder`` fixture) FAIL when it is not built
where it should have been: ``pip install -e .`` (scripts/setup.sh) builds it, but
setup.py marks it optional, so a broken build would otherwise go unnoticed. They skip
only when no build is expected: ``KAFSCALE_NO_NATIVE=1`` (a deliberate pure-Python
install), ``KAFSCALE_PURE_PYTHON=1`` (the extension is bypassed at run time), or no C
compiler on this machine.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import struct
import sysconfig

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import fastrecords
from protocol.batch import BATCH_HEADER_SIZE, BatchHeader, crc32c, read_header
from protocol.compression import Compression
from protocol.errors import ErrorCode, KafkaProtocolError
from protocol.fastrecords import RecordBuffers, decode_buffers, decode_python
from protocol.records import build_batch, decode_batch_columns, encode_varint
from tests.unit.protocol.test_records import MALFORMED, SAMPLE

NATIVE = fastrecords.IMPLEMENTATION == "c"
TS0 = 1_700_000_000_000

Rec = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def _split(batch: bytes) -> tuple[bytes, BatchHeader]:
    return batch[BATCH_HEADER_SIZE:], read_header(batch)


def _outcome(fn, *args, **kw):
    """Result of ``fn`` or the marker of a CORRUPT_MESSAGE error."""
    try:
        return fn(*args, **kw)
    except KafkaProtocolError as exc:
        assert exc.code is ErrorCode.CORRUPT_MESSAGE, exc
        return "CORRUPT"


def _both(batches, start=fastrecords.INT64_MIN, end=fastrecords.INT64_MAX, strict=True):
    fast = _outcome(decode_buffers, batches, start, end, strict_utf8=strict)
    slow = _outcome(decode_python, batches, start, end, strict_utf8=strict)
    assert fast == slow
    return fast


def _set(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def native_not_expected() -> str | None:
    """Why no native decoder is expected here, or None when it must be built and in use."""
    if _set("KAFSCALE_NO_NATIVE"):
        return "KAFSCALE_NO_NATIVE set: no C extension build expected"
    if _set("KAFSCALE_PURE_PYTHON"):
        return "KAFSCALE_PURE_PYTHON set: the pure-Python decoder is in use"
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    compiler = shlex.split(cc)[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler}) to build protocol._fastrecords"
    return None


@pytest.fixture
def native_decoder() -> None:
    """Run the test on the C extension; fail if it should be built and is not."""
    if NATIVE:
        return
    reason = native_not_expected()
    if reason is not None:
        pytest.skip(reason)
    pytest.fail(
        "protocol._fastrecords is not built although a C compiler is present: run "
        "`pip install -e .` (scripts/setup.sh) and read its build output, or set "
        "KAFSCALE_NO_NATIVE=1 where no native build is wanted"
    )


def test_native_extension_is_built(native_decoder: None) -> None:
    assert fastrecords.IMPLEMENTATION == "c" and fastrecords.native is not None


def test_sample_decodes_to_the_expected_columns() -> None:
    ts = [TS0 + 7 * i for i in range(len(SAMPLE))]
    raw = build_batch(SAMPLE, base_offset=1000, timestamps=ts)
    (rb,) = _both([_split(raw)])
    assert isinstance(rb, RecordBuffers) and rb.count == len(SAMPLE)
    assert rb.offset_list() == list(range(1000, 1000 + len(SAMPLE)))
    assert rb.timestamp_list() == ts and rb.timestamp_type_list() == [0] * len(SAMPLE)
    assert rb.key_list() == [k for k, _v, _h in SAMPLE]
    assert rb.value_list() == [v for _k, v, _h in SAMPLE]
    assert rb.header_list() == [tuple(h) for *_x, h in SAMPLE]
    assert rb.key_nulls == 2 and rb.value_nulls == 2 and rb.header_value_nulls == 1
    assert rb.key_validity == bytes([0b110101]) and rb.header_count == 4
    # the int32 offsets are Arrow's: n + 1 entries, last = data length
    assert struct.unpack(f"<{len(SAMPLE) + 1}i", rb.value_offsets)[-1] == len(rb.value_data)


def test_many_batches_offset_window_and_log_append_time() -> None:
    a = build_batch([(b"a%d" % i, b"x", []) for i in range(5)], base_offset=0, base_timestamp=5)
    b = build_batch(
        [(None, b"y%d" % i, [("h", None)]) for i in range(5)],
        base_offset=5,
        timestamps=[TS0 + i for i in range(5)],
        log_append_time=True,
    )
    (rb,) = _both([_split(a), _split(b)], 3, 8)
    assert rb.offset_list() == [3, 4, 5, 6, 7]
    assert rb.timestamp_list() == [5, 5, TS0 + 4, TS0 + 4, TS0 + 4]
    assert rb.timestamp_type_list() == [0, 0, 1, 1, 1]
    assert rb.key_list() == [b"a3", b"a4", None, None, None]
    assert rb.header_list() == [(), (), (("h", None),), (("h", None),), (("h", None),)]
    (empty,) = _both([_split(a)], 100, 200)
    assert empty.count == 0 and empty.offset_list() == [] and empty.header_list() == []


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_sections_raise_in_both(name: str) -> None:
    raw = MALFORMED[name]
    if name == "negative count":  # the header itself is refused before any record
        assert _both([_split(raw)]) == "CORRUPT"
        return
    assert _both([_split(raw)]) == "CORRUPT"
    assert _outcome(fastrecords.decode_batch_columns, raw) == "CORRUPT"


def _one_record_section(body: bytes) -> bytes:
    out = bytearray()
    encode_varint(len(body), out)
    return bytes(out) + body


def _hdr(base_offset: int = 0, base_ts: int = 0, count: int = 1) -> BatchHeader:
    raw = build_batch([(b"k", b"v", None)], base_offset=base_offset, base_timestamp=base_ts)
    h = read_header(raw)
    return dataclasses.replace(h, record_count=count)


def test_varints_past_64_bits_and_int64_overflow_are_corrupt() -> None:
    ten = b"\xff" * 9 + b"\x01"  # raw 2**64 - 1 -> zig-zag -2**63: still 64-bit
    eleven = b"\xff" * 9 + b"\x03"  # a 10th byte carrying bit 64
    ok = _both([(_one_record_section(b"\x00" + ten + b"\x00\x01\x01\x00"), _hdr(0, 2**62))])
    assert ok[0].timestamp_list() == [2**62 - 2**63]
    assert _both([(_one_record_section(b"\x00" + eleven + b"\x00\x01\x01\x00"), _hdr())]) == (
        "CORRUPT"
    )
    # offset delta pushing base_offset past int64
    big = bytearray()
    encode_varint(2**62, big)
    section = _one_record_section(b"\x00\x00" + bytes(big) + b"\x01\x01\x00")
    assert _both([(section, _hdr(2**62))]) == "CORRUPT"
    assert _both([(section, _hdr(0))])[0].offset_list() == [2**62]


def test_bad_utf8_header_key_strict_or_replaced() -> None:
    key = b"ok\xff\xe2\x82"
    body = b"\x00\x00\x00\x01\x01\x02" + bytes([len(key) * 2]) + key + b"\x01"
    section = _one_record_section(body)
    assert _both([(section, _hdr())]) == "CORRUPT"
    (rb,) = _both([(section, _hdr())], strict=False)
    assert rb.header_list() == [((key.decode("utf-8", "replace"), None),)]
    # a record outside the window is still validated in strict mode
    assert _both([(section, _hdr())], 5, 9) == "CORRUPT"


def test_bad_input_types() -> None:
    with pytest.raises(ValueError):
        decode_buffers([(b"one item",)])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        decode_buffers([("text is not bytes", _hdr())])  # type: ignore[list-item]


# ------------------------------------------------------------------------ properties

header_st = st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8))
record_st = st.tuples(
    st.none() | st.binary(max_size=40),
    st.none() | st.binary(max_size=300),
    st.lists(header_st, max_size=3),
)
batch_st = st.tuples(
    st.lists(record_st, min_size=1, max_size=12),
    st.integers(-(2**31), 2**42),  # base timestamp
    st.booleans(),  # log append time
)


def _build(batches: list[tuple[list[Rec], int, bool]], base: int) -> list[bytes]:
    out = []
    for recs, ts0, lat in batches:
        ts = [ts0 + 3 * i for i in range(len(recs))]
        out.append(build_batch(recs, base_offset=base, timestamps=ts, log_append_time=lat))
        base += len(recs)
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(batch_st, min_size=1, max_size=4),
    base=st.integers(0, 2**62),
    window=st.tuples(st.integers(0, 60), st.integers(0, 60)),
)
@pytest.mark.usefixtures("native_decoder")
def test_property_native_equals_python(
    batches: list[tuple[list[Rec], int, bool]], base: int, window: tuple[int, int]
) -> None:
    raws = _build(batches, base)
    flat = [r for recs, _t, _l in batches for r in recs]
    (rb,) = _both([_split(r) for r in raws])
    assert rb.key_list() == [k for k, _v, _h in flat]
    assert rb.value_list() == [v for _k, v, _h in flat]
    assert rb.header_list() == [tuple(h) for *_x, h in flat]
    assert rb.offset_list() == list(range(base, base + len(flat)))
    lo, hi = sorted(window)
    (part,) = _both([_split(r) for r in raws], base + lo, base + hi)
    assert part.offset_list() == list(range(base + lo, base + min(hi, len(flat))))
    for raw in raws:
        assert fastrecords.decode_batch_columns(raw, check_crc=True) == decode_batch_columns(
            raw, check_crc=True
        )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    recs=st.lists(record_st, min_size=1, max_size=6),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
    cut=st.integers(0, 10_000),
    count_delta=st.integers(-2, 2),
)
@pytest.mark.usefixtures("native_decoder")
def test_fuzz_mutated_sections_agree(
    recs: list[Rec], edits: list[tuple[int, int]], cut: int, count_delta: int
) -> None:
    raw = bytearray(build_batch(recs, base_offset=7, base_timestamp=TS0))
    for pos, val in edits:
        raw[BATCH_HEADER_SIZE + pos % (len(raw) - BATCH_HEADER_SIZE)] = val
    if cut % 3 == 0:
        raw = raw[: BATCH_HEADER_SIZE + cut % (len(raw) - BATCH_HEADER_SIZE + 1)]
    count = len(recs) + count_delta
    struct.pack_into(">i", raw, 8, len(raw) - 12)
    struct.pack_into(">i", raw, 57, count)
    struct.pack_into(">I", raw, 17, crc32c(memoryview(raw)[21:]))
    _both([_split(bytes(raw))])
    _both([_split(bytes(raw))], strict=False)
    if count >= 0:
        fast = _outcome(fastrecords.decode_batch_columns, bytes(raw))
        assert fast == _outcome(decode_batch_columns, bytes(raw))


@settings(max_examples=300, deadline=None)
@given(section=st.binary(max_size=200), count=st.integers(0, 6))
@pytest.mark.usefixtures("native_decoder")
def test_fuzz_random_bytes_agree(section: bytes, count: int) -> None:
    _both([(section, _hdr(count=count))])
    _both([(memoryview(section), _hdr(count=count))], 0, 3, strict=False)


@pytest.mark.parametrize("codec", list(Compression))
def test_decode_batch_columns_every_codec(codec: Compression) -> None:
    raw = build_batch(SAMPLE, base_offset=3, compression=codec, timestamps=[TS0] * len(SAMPLE))
    assert fastrecords.decode_batch_columns(raw) == decode_batch_columns(raw)
