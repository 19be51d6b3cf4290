"""Column-wise record decoding, native when ``protocol._fastrecords`` is built.

:func:`decode_buffers` turns the (decompressed) records sections of many v2 batches into
Arrow-ready buffers (:class:`RecordBuffers`): int64 offsets and timestamps, int32
timestamp types, key/value as (validity bitmap, int32 offsets, data) and headers as int32
list offsets into flat header key (UTF-8) / header value (binary) columns. Buffers are
native-endian ``bytes``; a validity bitmap is LSB-first, bit *i* set when row *i* is
not null (the Arrow layout), and ``None`` when the column has no null.

The C extension (``setup.py`` builds it at ``pip install -e .``) is used when importable;
otherwise, or with ``KAFSCALE_PURE_PYTHON=1`` in the environment, the pure-Python decoder
of :mod:`protocol.records` fills the same buffers. Both raise
``KafkaProtocolError(CORRUPT_MESSAGE)`` on malformed input and give identical results.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from protocol.batch import TIMESTAMP_TYPE_MASK, BatchHeader
from protocol.errors import ErrorCode, KafkaProtocolError
from protocol.native import load_native
from protocol.records import (
    BatchColumns,
    Buf,
    Headers,
    check_int64_range,
    decode_records_section,
    records_section,
)
from protocol.records import decode_batch_columns as _py_decode_batch_columns

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

#: (decompressed records section, its batch's header)
BatchInput = tuple[Buf, BatchHeader]


native = load_native("protocol._fastrecords")
#: "c" when the native decoder is in use, else "python"
IMPLEMENTATION = "c" if native is not None else "python"


@dataclass(frozen=True, slots=True)
class RecordBuffers:
    """Records decoded into Arrow-ready buffers (see the module doc for the layout)."""

    count: int
    offsets: bytes
    timestamps: bytes  # ms
    timestamp_types: bytes
    key_validity: bytes | None
    key_offsets: bytes
    key_data: bytes
    key_nulls: int
    value_validity: bytes | None
    value_offsets: bytes
    value_data: bytes
    value_nulls: int
    header_offsets: bytes  # count + 1 entries into the flat header columns
    header_key_offsets: bytes
    header_key_data: bytes
    header_value_validity: bytes | None
    header_value_offsets: bytes
    header_value_data: bytes
    header_count: int
    header_value_nulls: int

    def offset_list(self) -> list[int]:
        return _ints("q", self.offsets)

    def timestamp_list(self) -> list[int]:
        return _ints("q", self.timestamps)

    def timestamp_type_list(self) -> list[int]:
        return _ints("i", self.timestamp_types)

    def key_list(self) -> list[bytes | None]:
        return _binaries(self.count, self.key_validity, self.key_offsets, self.key_data)

    def value_list(self) -> list[bytes | None]:
        return _binaries(self.count, self.value_validity, self.value_offsets, self.value_data)

    def header_list(self) -> list[Headers]:
        keys = _binaries(self.header_count, None, self.header_key_offsets, self.header_key_data)
        vals = _binaries(
            self.header_count,
            self.header_value_validity,
            self.header_value_offsets,
            self.header_value_data,
        )
        pairs = [(k.decode("utf-8"), v) for k, v in zip(keys, vals, strict=True) if k is not None]
        offs = _ints("i", self.header_offsets)
        return [tuple(pairs[offs[i] : offs[i + 1]]) for i in range(self.count)]


def _ints(code: str, data: bytes) -> list[int]:
    arr = array(code)
    arr.frombytes(data)
    return arr.tolist()


def _binaries(n: int, validity: bytes | None, offsets: bytes, data: bytes) -> list[bytes | None]:
    offs = _ints("i", offsets)
    if validity is None:
        return [data[offs[i] : offs[i + 1]] for i in range(n)]
    return [
        data[offs[i] : offs[i + 1]] if validity[i >> 3] >> (i & 7) & 1 else None for i in range(n)
    ]


def _corrupt(message: str) -> KafkaProtocolError:
    return KafkaProtocolError(ErrorCode.CORRUPT_MESSAGE, message)


def _native_args(batches: Sequence[BatchInput]) -> list[tuple[Buf, int, int, int, int, int]]:
    return [
        (
            buf,
            h.base_offset,
            h.base_timestamp,
            h.max_timestamp,
            1 if h.attributes & TIMESTAMP_TYPE_MASK else 0,
            h.record_count,
        )
        for buf, h in batches
    ]


def _decode_native(
    batches: Sequence[BatchInput], start: int, end: int, strict_utf8: bool
) -> list[RecordBuffers]:
    assert native is not None
    try:
        raw = native.decode(_native_args(batches), start, end, strict_utf8)
    except native.CorruptRecords as exc:
        raise _corrupt(f"malformed record: {exc}") from exc
    except OverflowError:  # a column past 2 GiB: decode the halves separately
        if len(batches) < 2:
            raise
        half = len(batches) // 2
        return _decode_native(batches[:half], start, end, strict_utf8) + _decode_native(
            batches[half:], start, end, strict_utf8
        )
    n, off, ts, tst, kv, ko, kd, kn, vv, vo, vd, vn, ho, hko, hkd, hvv, hvo, hvd, hc, hvn = raw
    return [
        RecordBuffers(
            n,
            off,
            ts,
            tst,
            kv if kn else None,
            ko,
            kd,
            kn,
            vv if vn else None,
            vo,
            vd,
            vn,
            ho,
            hko,
            hkd,
            hvv if hvn else None,
            hvo,
            hvd,
            hc,
            hvn,
        )
    ]


def _bitmap(flags: list[bool]) -> bytes:
    """LSB-first validity bitmap of ``flags``."""
    bits = "".join("1" if f else "0" for f in reversed(flags))
    return int(bits or "0", 2).to_bytes((len(flags) + 7) // 8, "little")


def _pack_binary(items: list[bytes | None]) -> tuple[bytes | None, bytes, bytes, int]:
    offs = array("i", [0])
    offs.extend(accumulate(0 if x is None else len(x) for x in items))
    nulls = items.count(None)
    validity = _bitmap([x is not None for x in items]) if nulls else None
    data = b"".join([x for x in items if x is not None])
    return validity, offs.tobytes(), data, nulls


def _decode_python(
    batches: Sequence[BatchInput], start: int, end: int, strict_utf8: bool
) -> list[RecordBuffers]:
    offsets: list[int] = []
    timestamps: list[int] = []
    ts_types: list[int] = []
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    headers: list[Headers] = []
    for buf, hdr in batches:
        if hdr.record_count < 0:
            raise _corrupt("malformed record: negative record count")
        try:
            o, t, k, v, h = decode_records_section(
                bytes(buf), hdr, "strict" if strict_utf8 else "replace"
            )
        except (IndexError, ValueError) as exc:
            raise _corrupt(f"malformed record: {exc}") from exc
        check_int64_range(o, t)
        keep = [i for i, off in enumerate(o) if start <= off < end]
        if len(keep) != len(o):
            o, t = [o[i] for i in keep], [t[i] for i in keep]
            k, v, h = [k[i] for i in keep], [v[i] for i in keep], [h[i] for i in keep]
        offsets += o
        timestamps += t
        ts_types += [1 if hdr.attributes & TIMESTAMP_TYPE_MASK else 0] * len(o)
        keys += k
        values += v
        headers += h
    flat = [pair for hs in headers for pair in hs]
    kv, ko, kd, kn = _pack_binary(keys)
    vv, vo, vd, vn = _pack_binary(values)
    _hkv, hko, hkd, _n = _pack_binary([k.encode("utf-8") for k, _v in flat])
    hvv, hvo, hvd, hvn = _pack_binary([v for _k, v in flat])
    hoffs = array("i", [0])
    hoffs.extend(accumulate(len(hs) for hs in headers))
    return [
        RecordBuffers(
            len(offsets),
            array("q", offsets).tobytes(),
            array("q", timestamps).tobytes(),
            array("i", ts_types).tobytes(),
            kv,
            ko,
            kd,
            kn,
            vv,
            vo,
            vd,
            vn,
            hoffs.tobytes(),
            hko,
            hkd,
            hvv,
            hvo,
            hvd,
            len(flat),
            hvn,
        )
    ]


def decode_buffers(
    batches: Sequence[BatchInput],
    start: int = INT64_MIN,
    end: int = INT64_MAX,
    *,
    strict_utf8: bool = True,
) -> list[RecordBuffers]:
    """Decode the records of every batch with ``start <= offset < end`` (all validated).

    Usually one :class:`RecordBuffers`; more when a column would pass 2 GiB (int32
    offsets). ``strict_utf8=False`` replaces bad UTF-8 in header keys with U+FFFD instead
    of raising. Timestamps are ``baseTimestamp + delta`` or, for LOG_APPEND_TIME batches,
    the batch's ``maxTimestamp`` (timestamp type 1).
    """
    if native is not None:
        return _decode_native(batches, start, end, strict_utf8)
    return _decode_python(batches, start, end, strict_utf8)


def decode_python(
    batches: Sequence[BatchInput],
    start: int = INT64_MIN,
    end: int = INT64_MAX,
    *,
    strict_utf8: bool = True,
) -> list[RecordBuffers]:
    """:func:`decode_buffers` through the pure-Python decoder (the fallback; for tests)."""
    return _decode_python(batches, start, end, strict_utf8)


def decode_batch_columns(batch: Buf, *, check_crc: bool = False) -> BatchColumns:
    """:func:`protocol.records.decode_batch_columns`, natively when the extension is built."""
    if native is None:
        return _py_decode_batch_columns(batch, check_crc=check_crc)
    hdr, section = records_section(batch, check_crc)
    (rb,) = _decode_native([(section, hdr)], INT64_MIN, INT64_MAX, True)
    return BatchColumns(
        hdr,
        rb.offset_list(),
        rb.timestamp_list(),
        rb.key_list(),
        rb.value_list(),
        rb.header_list(),
    )


__all__ = [
    "IMPLEMENTATION",
    "BatchInput",
    "RecordBuffers",
    "decode_batch_columns",
    "decode_buffers",
    "decode_python",
]
