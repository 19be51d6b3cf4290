"""Registry schemas -> Iceberg types for typed tables (docs/ingest.md, "Typed values").

Avro: records -> structs, arrays -> lists, maps -> maps (string keys), enums -> strings,
``[null, T]`` -> optional T, other unions -> a struct with one optional field per branch
named after it (``int``, ``string``, the record's short name, ...: Kafka Connect's
AvroConverter shape), logical types decimal, date, time-millis/micros (-> time),
timestamp-millis/micros (-> timestamptz), local-timestamp-* (-> timestamp), uuid (-> string).
Protobuf (from the registered descriptor): messages -> structs, repeated -> lists, maps ->
maps, enums -> strings, 32-bit ints -> int (unsigned -> long), 64-bit ints -> long,
``google.protobuf.Timestamp`` -> timestamptz; oneof members are optional fields.
JSON Schema: object -> struct (or map<string, T> with only ``additionalProperties``),
array -> list, integer -> long, number -> double, string (format date / date-time ->
date / timestamptz), boolean; ``[T, "null"]`` -> optional T; anything else -> string
holding the JSON text. Every column is optional (tombstones and added fields are null).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
)

from ingest_job.jsonvals import column_name

_AVRO_PRIMS: dict[str, IcebergType] = {
    "boolean": BooleanType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "bytes": BinaryType(),
    "string": StringType(),
}
VALUE_COLUMN = "value_data"  # the column of a value whose schema is not a record/object


class TypedSchemaError(ValueError):
    """A schema this job cannot map to Iceberg."""


class _Ids:
    def __init__(self) -> None:
        self._it: Iterator[int] = itertools.count(1000)

    def __call__(self) -> int:
        return next(self._it)


def _struct(fields: list[tuple[str, IcebergType]], ids: _Ids) -> StructType:
    return StructType(*[NestedField(ids(), n, t, required=False) for n, t in fields])


def top_name(name: str, prefix: str = "") -> str:
    """The column of a top-level field: renamed away from the Kafka columns for values,
    ``key_<name>`` for keys (``prefix="key_"``)."""
    return prefix + name if prefix else column_name(name)


def _top(t: IcebergType, ids: _Ids, prefix: str = "") -> Schema:
    """Top-level columns: a struct's fields (renamed away from the Kafka columns)."""
    if isinstance(t, StructType):
        fields = [(top_name(f.name, prefix), f.field_type) for f in t.fields]
    else:
        fields = [(f"{prefix}data" if prefix else VALUE_COLUMN, t)]
    return Schema(*[NestedField(ids(), n, ft, required=False) for n, ft in fields])


# ---------------------------------------------------------------------------- Avro


def union_branch_name(branch: Any) -> str:
    """The struct field a non-null union branch becomes (Kafka Connect's naming)."""
    if isinstance(branch, str):
        return branch.rsplit(".", 1)[-1]
    if isinstance(branch, dict):
        if branch.get("type") in ("record", "error", "enum", "fixed"):
            return str(branch["name"]).rsplit(".", 1)[-1]
        return str(branch.get("type"))
    return "union"


def avro_type(schema: Any, named: dict[str, Any], ids: _Ids, ns: str | None = None) -> IcebergType:
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        if len(branches) == 1:
            return avro_type(branches[0], named, ids, ns)
        return _struct(
            [(union_branch_name(b), avro_type(b, named, ids, ns)) for b in branches], ids
        )
    if isinstance(schema, str):
        if schema in _AVRO_PRIMS:
            return _AVRO_PRIMS[schema]
        full = schema if "." in schema or not ns else f"{ns}.{schema}"
        for cand in (full, schema):
            if cand in named:
                return avro_type(named[cand], named, ids, cand.rsplit(".", 1)[0] or None)
        raise TypedSchemaError(f"unknown Avro type {schema!r}")
    kind = schema.get("type")
    logical = schema.get("logicalType")
    if logical == "decimal":
        return DecimalType(int(schema["precision"]), int(schema.get("scale", 0)))
    if logical == "date":
        return DateType()
    if logical in ("time-millis", "time-micros"):
        return TimeType()
    if logical in ("timestamp-millis", "timestamp-micros", "timestamp-nanos"):
        return TimestamptzType()
    if logical in ("local-timestamp-millis", "local-timestamp-micros"):
        return TimestampType()
    if logical == "uuid":
        return StringType()
    if kind in _AVRO_PRIMS:
        return _AVRO_PRIMS[kind]
    if kind == "array":
        return ListType(ids(), avro_type(schema["items"], named, ids, ns), element_required=False)
    if kind == "map":
        return MapType(
            ids(), StringType(), ids(), avro_type(schema["values"], named, ids, ns),
            value_required=False,
        )  # fmt: skip
    if kind in ("record", "error", "enum", "fixed"):
        name = str(schema["name"])
        space = schema.get("namespace", ns)
        full = name if "." in name or not space else f"{space}.{name}"
        named[full] = schema
        inner = full.rsplit(".", 1)[0] if "." in full else None
        if kind == "enum":
            return StringType()
        if kind == "fixed":
            return FixedType(int(schema["size"]))
        return _struct(
            [(f["name"], avro_type(f["type"], named, ids, inner)) for f in schema["fields"]], ids
        )
    if isinstance(kind, list | dict):
        return avro_type(kind, named, ids, ns)
    if isinstance(kind, str):
        return avro_type(kind, named, ids, ns)
    raise TypedSchemaError(f"unsupported Avro schema {str(schema)[:80]}")


def avro_columns(schema_text: str, ref_texts: list[str], prefix: str = "") -> Schema:
    named: dict[str, Any] = {}
    ids = _Ids()
    for ref in ref_texts:
        avro_type(json.loads(ref), named, ids)
    return _top(avro_type(json.loads(schema_text), named, ids), ids, prefix)


# ---------------------------------------------------------------------------- Protobuf

_PB_INT32 = {"int32", "sint32", "sfixed32"}
_PB_LONG = {"int64", "sint64", "sfixed64", "uint32", "fixed32", "uint64", "fixed64"}


def proto_type(field: Any, ids: _Ids, depth: int = 0) -> IcebergType:
    """The Iceberg type of one protobuf FieldDescriptor (labels included)."""
    from google.protobuf.descriptor import FieldDescriptor as FD

    if field.type == FD.TYPE_MESSAGE and field.message_type.GetOptions().map_entry:
        kf, vf = (
            field.message_type.fields_by_name["key"],
            field.message_type.fields_by_name["value"],
        )
        return MapType(
            ids(), _proto_single(kf, ids, depth), ids(), _proto_single(vf, ids, depth),
            value_required=False,
        )  # fmt: skip
    single = _proto_single(field, ids, depth)
    if field.is_repeated:
        return ListType(ids(), single, element_required=False)
    return single


def _proto_single(field: Any, ids: _Ids, depth: int) -> IcebergType:
    from google.protobuf.descriptor import FieldDescriptor as FD

    if field.type == FD.TYPE_MESSAGE:
        return proto_message_type(field.message_type, ids, depth + 1)
    if field.type == FD.TYPE_ENUM:
        return StringType()
    name = _PB_TYPE_NAMES[field.type]
    if name in _PB_INT32:
        return IntegerType()
    if name in _PB_LONG:
        return LongType()
    return {
        "double": DoubleType(), "float": FloatType(), "bool": BooleanType(),
        "string": StringType(), "bytes": BinaryType(),
    }[name]  # fmt: skip


def proto_message_type(desc: Any, ids: _Ids, depth: int = 0) -> IcebergType:
    if desc.full_name == "google.protobuf.Timestamp":
        return TimestamptzType()
    if depth > 32:
        raise TypedSchemaError(f"protobuf message {desc.full_name} nests too deep (recursive?)")
    return _struct([(f.name, proto_type(f, ids, depth)) for f in desc.fields], ids)


def _pb_type_names() -> dict[int, str]:
    from google.protobuf import descriptor_pb2

    t = descriptor_pb2.FieldDescriptorProto.Type
    return {v: k[len("TYPE_") :].lower() for k, v in t.items()}


_PB_TYPE_NAMES = _pb_type_names()


def proto_columns(desc: Any, prefix: str = "") -> Schema:
    ids = _Ids()
    return _top(proto_message_type(desc, ids), ids, prefix)


# ---------------------------------------------------------------------------- JSON Schema


def json_type(schema: Any, ids: _Ids, defs: dict[str, Any], depth: int = 0) -> IcebergType:
    if not isinstance(schema, dict) or depth > 32:
        return StringType()
    if "$ref" in schema:
        target = defs.get(str(schema["$ref"]).rsplit("/", 1)[-1])
        return json_type(target, ids, defs, depth + 1) if target is not None else StringType()
    t = schema.get("type")
    if isinstance(t, list):
        kinds = [k for k in t if k != "null"]
        if len(kinds) != 1:
            return DoubleType() if set(kinds) == {"integer", "number"} else StringType()
        t = kinds[0]
    if t is None and "properties" in schema:
        t = "object"
    for key in ("anyOf", "oneOf"):
        if t is None and key in schema:
            alts = [a for a in schema[key] if not (isinstance(a, dict) and a.get("type") == "null")]
            if len(alts) == 1:
                return json_type(alts[0], ids, defs, depth + 1)
    if t == "integer":
        return LongType()
    if t == "number":
        return DoubleType()
    if t == "boolean":
        return BooleanType()
    if t == "string":
        fmt = str(schema.get("format", ""))
        return {"date": DateType(), "date-time": TimestamptzType()}.get(fmt, StringType())
    if t == "array" and isinstance(schema.get("items"), dict):
        return ListType(
            ids(), json_type(schema["items"], ids, defs, depth + 1), element_required=False
        )
    if t == "object":
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        if not props and isinstance(extra, dict):
            return MapType(
                ids(), StringType(), ids(), json_type(extra, ids, defs, depth + 1),
                value_required=False,
            )  # fmt: skip
        if props:
            return _struct([(n, json_type(s, ids, defs, depth + 1)) for n, s in props.items()], ids)
    return StringType()


def json_columns(schema_text: str, prefix: str = "") -> Schema:
    doc = json.loads(schema_text)
    defs: dict[str, Any] = {}
    if isinstance(doc, dict):
        for key in ("definitions", "$defs"):
            defs.update(doc.get(key) or {})
    ids = _Ids()
    return _top(json_type(doc, ids, defs), ids, prefix)
