"""The columnar decoders of the ingest task give what the value-by-value paths give.

Values come from real record batches (compressed and not, with headers, null values, an
aborted transaction and its control markers) decoded by ``decode_unit`` as a task does;
then the JSON array path (``parse_json_array``: values joined natively for pyarrow's
JSON reader) is compared with ``parse_json_values`` over the same values as Python
objects, and the columnar Avro path (``typed_fast.avro_fast``) with the per-value
decoder (``typed.decode_values``, fastavro). Where the fast path must step aside
(malformed, mixed schema ids, logical types, ...) the tests check that it does.

The tests of the native helpers fail when ``ingest_job._columnar`` is not built on a
machine with a C compiler (as ``tests/unit/protocol/test_fastrecords.py`` does); the
JSON tests run on whichever implementation is in use (``KAFSCALE_PURE_PYTHON=1``: the
Python join).
"""

from __future__ import annotations

import io
import json
import math
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from broker.meta.schema import MarkerRequest, RegistrySchema
from broker.txn_markers import control_batch
from ingest_job import columnar, typed_fast
from ingest_job.columnar import json_lines
from ingest_job.jsonvals import parse_json_array, parse_json_values
from ingest_job.model import SegmentRef, WorkUnit
from ingest_job.task import decode_unit
from ingest_job.typed import RegistryEntry, TypedSpec, decode_values, typed_tables
from protocol.batch import set_base_offset
from protocol.compression import Compression
from protocol.records import build_batch
from segments.writer import build_segment
from tests.unit.protocol.test_fastrecords import native_not_expected

CODECS = [Compression.NONE, Compression.LZ4, Compression.ZSTD, Compression.GZIP]


@pytest.fixture
def native_columnar() -> None:
    """Run the test on the C helpers; fail if they should be built and are not."""
    if columnar.native is not None:
        return
    reason = native_not_expected()
    if reason is not None:
        pytest.skip(reason)
    pytest.fail(
        "ingest_job._columnar is not built although a C compiler is present: run "
        "`pip install -e .` (scripts/setup.sh) and read its build output"
    )


def _unit_values(values: list[bytes | None], codec: int) -> pa.Table:
    """The raw table a task decodes from one segment holding ``values`` in batches of 7
    (headers on odd offsets), after an aborted transaction and the markers."""
    batches: list[memoryview] = []

    def add(raw: bytes) -> None:
        buf = bytearray(raw)
        set_base_offset(buf, next_offset[0])
        batches.append(memoryview(buf))

    next_offset = [0]
    add(build_batch([(None, b"aborted {", None)] * 2, producer_id=9, producer_epoch=0,
                    base_sequence=0, transactional=True))  # fmt: skip
    next_offset[0] = 2
    add(control_batch(MarkerRequest(9, 0, False)))
    next_offset[0] = 3
    for i in range(0, len(values), 7):
        chunk = values[i : i + 7]
        recs = [
            (f"k{i + j}".encode(), v, [("h", b"x")] if (i + j) % 2 else [])
            for j, v in enumerate(chunk)
        ]
        add(build_batch(recs, compression=codec))
        next_offset[0] += len(chunk)
    seg = build_segment(0, batches)
    data = b"".join(bytes(b) for b in seg.buffers)
    ref = SegmentRef("t", 0, 0, seg.last_offset, seg.size, seg.record_count, "", "k")
    unit = WorkUnit(0, "t", 0, 0, seg.last_offset + 1, (ref,), aborted=((9, 0, 2),))
    return decode_unit(unit, [data]).to_table()


# ---------------------------------------------------------------------------- JSON

JSON_VALUES: list[bytes | None] = [
    json.dumps({"id": i, "name": f"n{i}", "ok": i % 3 == 0, "x": i / 4}).encode() for i in range(40)
]
JSON_VALUES[5] = None  # a tombstone
JSON_VALUES[9] = b'{"id": 9, "extra": "\\u00e9\\n"}'  # escapes; a field seen once


def _nan_free(arr: pa.Array) -> list[Any]:
    return ["NaN" if isinstance(v, float) and math.isnan(v) else v for v in arr.to_pylist()]


def _same_json(values: pa.ChunkedArray, offsets: pa.ChunkedArray, known: dict[str, str]) -> Any:
    fast = parse_json_array(values, offsets, known)
    exact = parse_json_values(values.to_pylist(), offsets.to_pylist(), known)
    assert (list(fast.rows), fast.dead, fast.conflicts) == (
        list(exact.rows),
        exact.dead,
        exact.conflicts,
    )
    assert fast.kinds() == exact.kinds()
    got = [(n, a.type, _nan_free(a)) for n, a in fast.arrays()]
    assert got == [(n, a.type, _nan_free(a)) for n, a in exact.arrays()]
    return fast


@pytest.mark.parametrize("codec", CODECS)
def test_json_array_path_equals_exact_path_on_real_batches(codec: int) -> None:
    raw = _unit_values(JSON_VALUES, codec)
    assert raw.column("offset").to_pylist() == list(range(3, 43))  # aborted + markers gone
    fast = _same_json(raw.column("value"), raw.column("offset"), {})
    assert fast.arrow is not None  # the vectorized path was taken
    assert fast.kinds() == {"extra": "string", "id": "long", "name": "string", "ok": "boolean",
                            "x": "double"}  # fmt: skip


@pytest.mark.parametrize(
    ("bad", "known"),
    [
        (b'{"id": "nine"}', {"id": "long"}),  # type conflict with the table: dead letter
        (b"not json", {}),
        (b'{"nested": {"a": [1]}}', {}),  # kept as JSON text by the exact path
        (b'{"id": 9, "id": 10}', {}),
        (b'{"id": true}', {}),  # a kind conflict within the run
        (b'{"id": 99999999999999999999}', {}),  # past 64 bits
        (b'{"id": NaN}', {}),
        (b'{"s": "\xff"}', {}),  # not UTF-8
        (b'{"i\\u0064": 1}', {}),  # an escaped key
        (b'{"id": 1} x', {}),
    ],
)
def test_json_array_path_steps_aside_where_it_could_differ(
    bad: bytes, known: dict[str, str]
) -> None:
    values = list(JSON_VALUES)
    values[20] = bad
    raw = _unit_values(values, Compression.LZ4)
    _same_json(raw.column("value"), raw.column("offset"), known)
    if columnar.native is not None:
        flat = columnar.json_flat_columns(raw.column("value"))
        # a kind conflict with the table is decided on the parsed columns (jsonvals)
        assert flat is None or known


VALID = [
    b'{"id":\n9}',  # spans lines (the line-joining path steps aside, the native one not)
    b'\t{ "id" :\r\n 9 , "x": -0 } ',
    b'{"s": "\\ud83d\\ude00 \\u00e9\\n\\t\\"\\\\\\/\\b\\f\\r \\u0000 \xc3\xa9"}',
    b'{"x": 1e5, "id": -9223372036854775808, "n": null}',
    b'{"x": 2.5E-3, "id": 9223372036854775807, "s": ""}',
    b"{}",
]


@pytest.mark.parametrize("value", VALID)
def test_json_native_parser_equals_exact_path(native_columnar: None, value: bytes) -> None:
    values = list(JSON_VALUES)
    values[20] = value
    raw = _unit_values(values, Compression.NONE)
    fast = _same_json(raw.column("value"), raw.column("offset"), {})
    assert fast.arrow is not None


JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**64), max_value=2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(
        st.none()
        | st.dictionaries(st.sampled_from(["a", "b", "c.d", "offset", "é"]), JSON_SCALARS),
        min_size=1,
        max_size=12,
    ),
    known=st.dictionaries(
        st.sampled_from(["a", "b"]), st.sampled_from(["long", "double", "string"])
    ),
    indent=st.sampled_from([None, 1]),
)
# a long past 2**53 in a double column: the native path's cast refused it
@example(rows=[{"a": 2**53 + 1}], known={"a": "double"}, indent=None)
@example(rows=[{"a": -(2**63)}, {"a": 2**63 - 1}], known={"a": "double"}, indent=None)
def test_json_array_path_equals_exact_path_on_random_objects(
    rows: list[dict[str, Any] | None], known: dict[str, str], indent: int | None
) -> None:
    values = [None if r is None else json.dumps(r, indent=indent).encode() for r in rows]
    arr = pa.array(values, pa.binary())
    _same_json(arr, pa.array(range(len(values)), pa.int64()), known)


def test_json_native_parser_steps_aside_for_a_lone_surrogate(native_columnar: None) -> None:
    for value in (b'{"s": "\\ud800"}', b'{"s": "\\udc00 x"}', b'{"s": "\\ud800\\u0041"}'):
        assert columnar.json_flat_columns(pa.array([b'{"s": "a"}', value])) is None


def test_json_lines_joins_slices_chunks_and_nulls() -> None:
    arr = pa.array([b'{"a":1}', None, b"", b'{"b":2}', b'{"c":3}'], pa.binary())
    assert json_lines(arr) == b'{"a":1}\n{}\n\n{"b":2}\n{"c":3}'
    assert json_lines(arr.slice(1, 3)) == b'{}\n\n{"b":2}'  # array offset, first is null
    chunked = pa.chunked_array([arr.slice(0, 2), arr.slice(0, 0), arr.slice(3, 2)])
    assert json_lines(chunked) == b'{"a":1}\n{}\n{"b":2}\n{"c":3}'
    assert json_lines(pa.array([b"{}", b"a\nb"], pa.binary())) is None
    assert json_lines(pa.array([b"a\rb"], pa.binary())) is None
    assert json_lines(pa.array([], pa.binary())) == b""


# ---------------------------------------------------------------------------- Avro

FLAT: dict[str, Any] = {
    "type": "record", "name": "Flat",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "small", "type": "int"},
        {"name": "ok", "type": "boolean"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": {"type": "double"}},
        {"name": "s", "type": ["null", "string"]},
        {"name": "b", "type": ["bytes", "null"]},
        {"name": "n", "type": ["null", "long"], "default": None},
    ],
}  # fmt: skip
COLUMNS = pa.schema(
    [
        ("id", pa.int64()),
        ("small", pa.int64()),  # promoted int -> long by an earlier version
        ("ok", pa.bool_()),
        ("f", pa.float32()),
        ("d", pa.float64()),
        ("s", pa.large_string()),
        ("b", pa.large_binary()),
        ("n", pa.int64()),
        ("later", pa.large_string()),  # a column of another version: null here
    ]
)


def _entry(sid: int, schema: dict[str, Any]) -> RegistryEntry:
    return RegistryEntry(sid, RegistrySchema("AVRO", json.dumps(schema)), ())


def _avro(sid: int, schema: dict[str, Any], rec: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    out.write(b"\0" + sid.to_bytes(4, "big"))
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), rec)
    return out.getvalue()


def _flat_record(i: int) -> dict[str, Any]:
    return {
        "id": i * 10**12 - 5, "small": -i, "ok": i % 2 == 0, "f": i / 8, "d": i / 3,
        "s": None if i % 4 == 0 else f"sé{i}" * (i % 5),
        "b": None if i % 3 == 0 else bytes([i]) * i, "n": None if i % 2 else i,
    }  # fmt: skip


def _spec(*entries: RegistryEntry, **kw: Any) -> TypedSpec:
    return TypedSpec("AVRO", entries, (("t", COLUMNS),), **kw)


def _exact_table(spec: TypedSpec, raw: pa.Table, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as m:
        m.setattr(typed_fast, "native", None)
        return typed_tables(spec, raw, "t")


@pytest.mark.parametrize("codec", CODECS)
def test_avro_columnar_path_equals_per_value_path_on_real_batches(
    native_columnar: None, codec: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _spec(_entry(3, FLAT))
    raw = _unit_values([_avro(3, FLAT, _flat_record(i)) for i in range(60)], codec)
    fast = typed_fast.avro_fast({3: spec.entries[0]}, COLUMNS, raw.column("value"))
    assert fast is not None
    good, arr, dead, _ops = decode_values(
        spec, COLUMNS, raw.column("value").to_pylist(), raw.column("offset").to_pylist()
    )
    assert dead == [] and good == list(range(60))
    assert fast.type == arr.type and fast.to_pylist() == arr.to_pylist()
    got, got_dead = typed_tables(spec, raw, "t")
    want, want_dead = _exact_table(spec, raw, monkeypatch)
    assert got.schema == want.schema and got.to_pylist() == want.to_pylist()
    assert got_dead.num_rows == want_dead.num_rows == 0


def _with_bad(bad: bytes | None) -> pa.Table:
    values: list[bytes | None] = [_avro(3, FLAT, _flat_record(i)) for i in range(30)]
    values[17] = bad
    return _unit_values(values, Compression.NONE)


GOOD = _avro(3, FLAT, _flat_record(17))
WIDE = {**FLAT, "fields": [{**f, "type": "long"} if f["name"] == "small" else f
                           for f in FLAT["fields"]]}  # fmt: skip
BAD_VALUES = {
    "tombstone": None,
    "trailing byte": GOOD + b"\0",
    "truncated": GOOD[:-1],
    "other schema id": b"\0\0\0\0\4" + GOOD[5:],
    "not the wire format": b"\1" + GOOD[1:],
    # "small" (an int) holding 2**40: the exact path decides (its column is a long)
    "int past 32 bits": _avro(3, WIDE, {**_flat_record(17), "small": 2**40}),
}


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_avro_columnar_path_steps_aside_for_values_it_does_not_decode(
    native_columnar: None, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _spec(_entry(3, FLAT), _entry(4, FLAT))
    raw = _with_bad(BAD_VALUES[name])
    assert typed_fast.avro_fast({e.schema_id: e for e in spec.entries}, COLUMNS,
                                raw.column("value")) is None  # fmt: skip
    got, got_dead = typed_tables(spec, raw, "t")
    want, want_dead = _exact_table(spec, raw, monkeypatch)
    assert got.to_pylist() == want.to_pylist() and got_dead.to_pylist() == want_dead.to_pylist()


@pytest.mark.parametrize(
    ("field", "good", "bad"),
    [
        ("string", b"\x04ok", b"\x04\xff\xfe"),  # invalid UTF-8
        (["null", "long"], b"\x02\x0a", b"\x04\x0a"),  # union branch 2 of 2
        ("boolean", b"\x01", b"\x02"),
        ("double", b"\0" * 8, b"\0" * 7),
    ],
)
def test_avro_malformed_payloads_step_aside(
    native_columnar: None, field: Any, good: bytes, bad: bytes
) -> None:
    schema = {"type": "record", "name": "S", "fields": [{"name": "v", "type": field}]}
    kind = typed_fast._field_code(field)
    assert kind is not None
    cols = pa.schema([("v", kind[1])])
    entries = {1: _entry(1, schema)}
    head = b"\0\0\0\0\1"
    ok = typed_fast.avro_fast(entries, cols, pa.array([head + good], pa.binary()))
    assert ok is not None
    assert ok.to_pylist() == [fastavro.schemaless_reader(io.BytesIO(good), schema)]
    values = pa.array([head + good, head + bad], pa.binary())
    assert typed_fast.avro_fast(entries, cols, values) is None


@pytest.mark.parametrize(
    "field",
    [
        {"name": "when", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "u", "type": ["null", "string", "long"]},
        {"name": "offset", "type": "long"},  # renamed away from the Kafka column
    ],
)
def test_avro_schemas_that_are_not_flat_take_the_exact_path(field: dict[str, Any]) -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}, field]}
    assert typed_fast.flat_plan(json.dumps(schema)) is None
    assert typed_fast.flat_plan(json.dumps(FLAT)) is not None


def test_avro_values_in_chunks_with_an_empty_first_one(native_columnar: None) -> None:
    values = [_avro(3, FLAT, _flat_record(i)) for i in range(5)]
    chunked = pa.chunked_array(
        [pa.array([], pa.binary()), pa.array(values[:2], pa.binary()), pa.array(values[2:])]
    )
    got = typed_fast.avro_fast({3: _entry(3, FLAT)}, COLUMNS, chunked)
    assert got is not None
    want = typed_fast.avro_fast({3: _entry(3, FLAT)}, COLUMNS, pa.array(values, pa.binary()))
    assert want is not None and got.to_pylist() == want.to_pylist()


def test_avro_column_of_an_incompatible_type_takes_the_exact_path(native_columnar: None) -> None:
    values = pa.array([_avro(3, FLAT, _flat_record(i)) for i in range(3)], pa.binary())
    cols = COLUMNS.set(0, pa.field("id", pa.int32()))  # long values, int column
    assert typed_fast.avro_fast({3: _entry(3, FLAT)}, cols, values) is None
    assert typed_fast.avro_fast({3: _entry(3, FLAT)}, COLUMNS, values) is not None
