"""Typed values without Spark: wire format, schema -> Iceberg mapping, decoding, CDC, fold."""

from __future__ import annotations

import base64
import io
import json
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import fastavro
import pyarrow as pa
import pytest
from pyiceberg.io import load_file_io

from broker.meta.schema import RegistrySchema
from ingest_job.model import WrittenFile
from ingest_job.task import write_parquet
from ingest_job.typed import RegistryEntry, TypedSpec, decode_values, value_columns
from ingest_job.typed_decode import WireFormatError, message_indexes, split_wire
from ingest_job.upsert import OP_COLUMN, CdcError, delete_filter, fold_files, unwrap_debezium
from tests.fixtures.registry_schemas import AVRO_V2, proto_class, proto_file

UNION = {
    "type": "record", "name": "U",
    "fields": [
        {"name": "choice", "type": ["null", "int", "string", {
            "type": "record", "name": "P", "fields": [{"name": "x", "type": "int"}]}]},
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "key", "type": "long"},
    ],
}  # fmt: skip


def _avro(schema: dict, value: dict, sid: int = 7) -> bytes:
    out = io.BytesIO()
    out.write(b"\0" + sid.to_bytes(4, "big"))
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    return out.getvalue()


def _spec(kind: str, entries: list[RegistryEntry]) -> tuple[TypedSpec, pa.Schema]:
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    cols = schema_to_pyarrow(value_columns(entries[-1]), include_field_ids=False)
    return TypedSpec(kind, tuple(entries), (("t", cols),)), cols


def test_wire_format() -> None:
    assert split_wire(b"\0\0\0\1\2xyz") == (258, 5)
    with pytest.raises(WireFormatError):
        split_wire(b"\1\0\0\0\1")
    with pytest.raises(WireFormatError):
        split_wire(b"\0\0")
    assert message_indexes(b"\0", 0) == ([0], 1)
    assert message_indexes(bytes([4, 2, 6]), 0) == ([1, 3], 3)  # zigzag: 2 entries: 1, 3
    with pytest.raises(WireFormatError):
        message_indexes(bytes([4, 2]), 0)


def test_avro_mapping_and_decoding() -> None:
    entry = RegistryEntry(7, RegistrySchema("AVRO", json.dumps(UNION)), ())
    spec, cols = _spec("AVRO", [entry])
    assert [f.name for f in cols] == ["choice", "id", "value_key"]  # key clashes: renamed
    assert (
        str(cols.field("choice").type)
        == "struct<int: int32, string: large_string, P: struct<x: int32>>"
    )
    values = [
        _avro(UNION, {"choice": 5, "id": "3b241101-e2bb-4255-8caf-4136c566a962", "key": 1}),
        _avro(UNION, {"choice": {"x": 2}, "id": "3b241101-e2bb-4255-8caf-4136c566a962", "key": 2}),
        _avro(UNION, {"choice": None, "id": "3b241101-e2bb-4255-8caf-4136c566a962", "key": 3}),
        _avro(UNION, {"choice": "s", "id": "3b241101-e2bb-4255-8caf-4136c566a962", "key": 4}, 99),
        None,
        b"garbage",
    ]
    good, arr, dead, ops = decode_values(spec, cols, values, list(range(6)))
    assert good == [0, 1, 2, 4] and ops == ["u", "u", "u", "d"]
    assert [d[0] for d in dead] == [3, 5]
    assert "schema id 99" in dead[0][1] and "wire format" in dead[1][1]
    rows = arr.to_pylist()
    assert rows[0]["choice"] == {"int": 5, "string": None, "P": None}
    assert rows[1]["choice"] == {"int": None, "string": None, "P": {"x": 2}}
    assert rows[2]["choice"] is None and rows[0]["id"] == "3b241101-e2bb-4255-8caf-4136c566a962"


def test_avro_logical_types_and_evolution_columns() -> None:
    entry = RegistryEntry(1, RegistrySchema("AVRO", json.dumps(AVRO_V2)), ())
    cols = value_columns(entry)
    types = {f.name: str(f.field_type) for f in cols.fields}
    assert types["amount"] == "decimal(10, 2)" and types["placed"] == "timestamptz"
    assert types["day"] == "date" and types["status"] == "string" and types["note"] == "string"
    assert types["attrs"].startswith("map<string, long>")
    assert all(not f.required for f in cols.fields)
    spec, arrow = _spec("AVRO", [entry])
    rec = {
        "id": 1, "customer": "c", "amount": Decimal("1.50"),
        "placed": datetime(2026, 1, 1, tzinfo=UTC), "day": date(2026, 1, 2), "status": "NEW",
        "tags": [], "attrs": {"a": 1}, "address": None, "qty": 1, "note": None,
    }  # fmt: skip
    _good, arr, dead, _ops = decode_values(spec, arrow, [_avro(AVRO_V2, rec, 1)], [0])
    assert dead == []
    row = arr.to_pylist()[0]
    assert row["amount"] == Decimal("1.50") and row["day"] == date(2026, 1, 2)
    assert row["attrs"] == [("a", 1)]


def test_protobuf_mapping_and_decoding() -> None:
    fdp = proto_file(2)
    b64 = base64.b64encode(fdp.SerializeToString()).decode()
    entry = RegistryEntry(3, RegistrySchema("PROTOBUF", b64), ())
    spec, cols = _spec("PROTOBUF", [entry])
    assert [f.name for f in cols] == [
        "sensor", "value_value", "count", "kind", "where", "samples", "note",
    ]  # fmt: skip
    cls = proto_class(2)
    msg = cls(sensor="s", value=2.5, count=-1, kind=1, samples=[3], note="n")
    data = b"\0" + (3).to_bytes(4, "big") + b"\0" + msg.SerializeToString()
    _good, arr, dead, _ops = decode_values(spec, cols, [data], [0])
    assert dead == []
    assert arr.to_pylist() == [{"sensor": "s", "value_value": 2.5, "count": -1, "kind": "TEMP",
                                "where": None, "samples": [3], "note": "n"}]  # fmt: skip
    # the same schema registered as .proto text (as Java and Go serializers do) decodes the
    # bytes a client built from the hand-made descriptor identically
    text_spec, text_cols = _spec(
        "PROTOBUF", [RegistryEntry(3, RegistrySchema("PROTOBUF", READING_TEXT), ())]
    )
    assert text_cols == cols
    assert decode_values(text_spec, text_cols, [data], [0])[1].to_pylist() == arr.to_pylist()


READING_TEXT = """syntax = "proto3"; package shop;
message Reading { enum Kind { UNKNOWN = 0; TEMP = 1; }
  message Location { double lat = 1; double lon = 2; }
  string sensor = 1; double value = 2; int64 count = 3; Kind kind = 4;
  Location where = 5; repeated int32 samples = 6; string note = 7; }"""


def test_proto_text_features() -> None:
    from google.protobuf import descriptor_pool, message_factory, timestamp_pb2

    from broker.registry.proto_descriptor import text_to_descriptor

    text = """syntax = "proto3"; package t; import "google/protobuf/timestamp.proto";
    message M { string a = 1; google.protobuf.Timestamp at = 2; map<string, int64> m = 3;
      optional int32 o = 4; oneof choice { string s = 5; int32 i = 6; }
      enum E { X = 0; Y = 1; } E e = 7; repeated N ns = 8; message N { int32 z = 1; } }"""
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    fdp = text_to_descriptor(text, "m.proto", pool)
    pool.Add(fdp)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("t.M"))
    msg = cls(a="x", m={"k": 2}, o=0, i=5, e=1)
    msg.at.seconds = 60
    msg.ns.add(z=3)
    back = cls.FromString(msg.SerializeToString())
    assert back.HasField("o") and back.WhichOneof("choice") == "i" and back.ns[0].z == 3
    b64 = base64.b64encode(fdp.SerializeToString()).decode()
    entry = RegistryEntry(9, RegistrySchema("PROTOBUF", text), ())
    spec, cols = _spec("PROTOBUF", [entry])
    data = b"\0" + (9).to_bytes(4, "big") + b"\0" + msg.SerializeToString()
    (row,) = decode_values(spec, cols, [data], [0])[1].to_pylist()
    assert row == {"a": "x", "at": datetime(1970, 1, 1, 0, 1, tzinfo=UTC), "m": [("k", 2)],
                   "o": 0, "s": None, "i": 5, "e": "Y", "ns": [{"z": 3}]}  # fmt: skip
    assert b64  # the converted descriptor serializes


def test_json_schema_coercion() -> None:
    schema = {"type": "object", "properties": {
        "n": {"type": "integer"}, "x": {"type": "number"},
        "d": {"type": "string", "format": "date"},
        "o": {"type": "object", "additionalProperties": {"type": "integer"}},
        "free": {}}}  # fmt: skip
    entry = RegistryEntry(5, RegistrySchema("JSON", json.dumps(schema)), ())
    spec, cols = _spec("JSON", [entry])
    value = {"n": 1, "x": 2, "d": "2026-03-04", "o": {"a": 1}, "free": {"k": [1]}}
    data = b"\0\0\0\0\5" + json.dumps(value).encode()
    bad = b"\0\0\0\0\5" + json.dumps({"n": "one"}).encode()
    _good, arr, dead, _ops = decode_values(spec, cols, [data, bad], [0, 1])
    assert arr.to_pylist() == [
        {"n": 1, "x": 2.0, "d": date(2026, 3, 4), "o": [("a", 1)], "free": '{"k":[1]}'}
    ]
    assert [d[0] for d in dead] == [1] and "does not fit" in dead[0][1]


def test_debezium_unwrap() -> None:
    row = {"id": 1}
    assert unwrap_debezium({"op": "c", "after": row}) == ("u", row)
    assert unwrap_debezium({"op": "r", "after": row}) == ("u", row)
    assert unwrap_debezium({"payload": {"op": "d", "before": row}}) == ("d", row)
    for bad in ({"op": "t"}, {"op": "u"}, [1], {"after": row}):
        with pytest.raises(CdcError):
            unwrap_debezium(bad)


def test_fold_newest_per_key_and_deletes(tmp_path: Path) -> None:
    io_ = load_file_io({})
    base = {"timestamp": pa.array([1, 2, 3, 4, 5], pa.timestamp("us", tz="UTC")),
            "partition": pa.array([0] * 5, pa.int32()), "offset": pa.array(range(5), pa.int64()),
            "id": [1, 2, 1, 3, 2], "v": ["a", "b", "c", "d", "e"],
            OP_COLUMN: ["u", "u", "u", "u", "d"]}  # fmt: skip
    t = pa.table(base)
    paths = []
    for i, part in enumerate((t.slice(0, 3), t.slice(3))):
        p = f"file://{tmp_path}/in-{i}.parquet"
        paths.append(WrittenFile("t", p, part.num_rows, write_parquet(io_, p, part)))
    files, keys = fold_files(io_, paths, ["id"], f"file://{tmp_path}", "run")
    assert sorted(keys.column("id").to_pylist()) == [1, 2, 3]
    (f,) = files
    import pyarrow.parquet as pq

    got = pq.read_table(f.path[len("file://") :])
    assert OP_COLUMN not in got.column_names
    assert sorted(zip(got["id"].to_pylist(), got["v"].to_pylist(), strict=True)) == [
        (1, "c"), (3, "d"),
    ]  # fmt: skip
    assert not any(Path(p.path[7:]).exists() for p in paths)  # inputs folded away
    assert str(delete_filter(pa.table({"id": [1, None]}))) == str(
        delete_filter(pa.table({"id": [1]}))
    )
    assert delete_filter(pa.table({"id": pa.array([None], pa.int64())})) is None


ENVELOPE = {
    "type": "record", "name": "Envelope", "namespace": "dbserver.inventory.items",
    "fields": [
        {"name": "before", "type": ["null", {"type": "record", "name": "Value", "fields": [
            {"name": "id", "type": "int"},
            {"name": "name", "type": ["null", "string"], "default": None}]}], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
    ],
}  # fmt: skip


def test_debezium_avro_columns_and_ops() -> None:
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    entry = RegistryEntry(8, RegistrySchema("AVRO", json.dumps(ENVELOPE)), ())
    cols = value_columns(entry, "debezium")
    assert [f.name for f in cols.fields] == ["id", "name"]
    arrow = schema_to_pyarrow(cols, include_field_ids=False)
    spec = TypedSpec("AVRO", (entry,), (("t", arrow),), "debezium", ("id",))
    row = {"id": 1, "name": "a"}
    values = [
        _avro(ENVELOPE, {"before": None, "after": row, "op": "c"}, 8),
        _avro(ENVELOPE, {"before": row, "after": {"id": 1, "name": "b"}, "op": "u"}, 8),
        _avro(ENVELOPE, {"before": row, "after": None, "op": "d"}, 8),
        None,  # the tombstone after a delete: skipped
        _avro(ENVELOPE, {"before": None, "after": None, "op": "t"}, 8),
    ]
    good, arr, dead, ops = decode_values(spec, arrow, values, list(range(5)))
    assert good == [0, 1, 2, 3] and ops == ["u", "u", "d", "skip"]
    assert arr.to_pylist()[:3] == [row, {"id": 1, "name": "b"}, row]
    assert [d[0] for d in dead] == [4] and "unsupported Debezium op 't'" in dead[0][1]


def test_key_format_columns_and_dead_letters() -> None:
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    from ingest_job.decode import RAW_SCHEMA
    from ingest_job.typed import typed_tables

    key_schema = {"type": "record", "name": "K", "fields": [{"name": "id", "type": "long"}]}
    val_schema = {"type": "record", "name": "V", "fields": [{"name": "n", "type": "string"}]}
    kentry = RegistryEntry(1, RegistrySchema("AVRO", json.dumps(key_schema)), ())
    ventry = RegistryEntry(2, RegistrySchema("AVRO", json.dumps(val_schema)), ())
    kcols = schema_to_pyarrow(value_columns(kentry, None, "key_"), include_field_ids=False)
    vcols = schema_to_pyarrow(value_columns(ventry), include_field_ids=False)
    assert kcols.names == ["key_id"]
    key_spec = TypedSpec("AVRO", (kentry,), (("t", kcols),), prefix="key_")
    spec = TypedSpec("AVRO", (ventry,), (("t", vcols),), key=key_spec)
    keys = [_avro(key_schema, {"id": 10}, 1), b"bad key", None, _avro(key_schema, {"id": 13}, 1)]
    vals = [_avro(val_schema, {"n": "a"}, 2), _avro(val_schema, {"n": "b"}, 2),
            _avro(val_schema, {"n": "c"}, 2), b"bad value"]  # fmt: skip
    raw = pa.table(
        {"topic": ["t"] * 4, "partition": pa.array([0] * 4, pa.int32()),
         "offset": pa.array(range(4), pa.int64()),
         "timestamp": pa.array([0] * 4, pa.timestamp("us", tz="UTC")),
         "timestamp_type": pa.array([0] * 4, pa.int32()), "key": keys, "value": vals,
         "headers": pa.array([[]] * 4, RAW_SCHEMA.field("headers").type)},
        schema=RAW_SCHEMA,
    )  # fmt: skip
    good, dead = typed_tables(spec, raw, "t")
    assert good.select(["offset", "key_id", "n"]).to_pylist() == [
        {"offset": 0, "key_id": 10, "n": "a"},
        {"offset": 2, "key_id": None, "n": "c"},
    ]
    assert dead["offset"].to_pylist() == [1, 3]


@pytest.mark.parametrize("key", ["id", "name", "key", "id,name"])
def test_stage_deletes_copy_on_write(tmp_path: Path, key: str) -> None:
    """Deleting keys rewrites only what holds them: vectorized for one key column
    (integer, string, binary), pyiceberg's predicate for composite keys."""
    from ingest_job import catalog as cat
    from ingest_job.upsert import stage_deletes

    catalog = cat.open_catalog(None, str(tmp_path / "cat"))
    cat.ensure_namespace(catalog, "ns")
    rows = pa.table({"id": pa.array(range(100), pa.int64()),
                     "name": [f"n{i}" for i in range(100)],
                     "key": [f"k{i}".encode() for i in range(100)]})  # fmt: skip
    tbl = catalog.create_table(("ns", "t"), schema=rows.schema)
    tbl.append(rows.slice(0, 50))
    tbl.append(rows.slice(50))
    cols = key.split(",")
    gone = [3, 7, 77]
    keys = rows.take(pa.array(gone)).select(cols)
    keys = pa.concat_tables([keys, rows.slice(0, 0).select(cols)])
    with tbl.transaction() as tx:
        stage_deletes(tx, keys)
    left = catalog.load_table(("ns", "t")).scan().to_arrow()
    assert sorted(left["id"].to_pylist()) == [i for i in range(100) if i not in gone]
