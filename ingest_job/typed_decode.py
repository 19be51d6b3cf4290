"""Confluent wire format values -> Python values shaped like the table's Arrow types.

A value is ``0x00``, the schema id (4 bytes, big endian), for Protobuf the message
indexes (zigzag varints: a count, then the path of the message type in the file; a single
``0`` means the first message), then the Avro / Protobuf / JSON payload. Decoders are
built in the Spark tasks from the registry's schemas the driver broadcast (docs/ingest.md).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from datetime import UTC, date, datetime
from typing import Any

from broker.meta.schema import RegistrySchema
from ingest_job.typed_schema import VALUE_COLUMN, top_name, union_branch_name

Convert = Callable[[Any], Any]
KINDS = {"avro": "AVRO", "protobuf": "PROTOBUF", "json-schema": "JSON"}


class WireFormatError(ValueError):
    """A value that is not in the Confluent wire format or does not decode."""


def _zigzag(data: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(data):
            raise WireFormatError("truncated message indexes")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise WireFormatError("bad varint in message indexes")


def split_wire(data: bytes) -> tuple[int, int]:
    """(schema id, payload start)."""
    if len(data) < 5 or data[0] != 0:
        raise WireFormatError("not in the Confluent wire format (magic byte 0 + schema id)")
    return int.from_bytes(data[1:5], "big"), 5


def message_indexes(data: bytes, pos: int) -> tuple[list[int], int]:
    count, pos = _zigzag(data, pos)
    if count == 0:
        return [0], pos
    if count < 0 or count > 64:
        raise WireFormatError(f"bad message index count {count}")
    out = []
    for _ in range(count):
        idx, pos = _zigzag(data, pos)
        out.append(idx)
    return out, pos


def top_level(value: Any, prefix: str = "") -> dict[str, Any]:
    """The row of a decoded value (or key, ``prefix="key_"``): a record's fields named like
    the columns, else one column."""
    if isinstance(value, dict):
        if not prefix and all(top_name(k) == k for k in value):
            return value  # no field needs renaming (the usual case): no copy
        return {top_name(k, prefix): v for k, v in value.items()}
    return {f"{prefix}data" if prefix else VALUE_COLUMN: value}


# ---------------------------------------------------------------------------- Avro


def _avro_converter(schema: Any, named: dict[str, Any], ns: str | None = None) -> Convert | None:
    """A function making fastavro's value fit the Arrow type (None: it already does)."""
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        if len(branches) == 1:
            inner = _avro_converter(branches[0], named, ns)
            return None if inner is None else (lambda v: None if v is None else inner(v))
        return _union_converter(branches, named, ns)
    if isinstance(schema, str):
        full = schema if "." in schema or not ns else f"{ns}.{schema}"
        target = named.get(full, named.get(schema))
        if target is None or target.get("type") != "record":
            return None
        return _avro_converter(target, named, full.rsplit(".", 1)[0] if "." in full else None)
    kind = schema.get("type")
    if schema.get("logicalType") == "uuid":
        return lambda v: None if v is None else str(v)
    if kind == "array":
        item = _avro_converter(schema["items"], named, ns)
        return None if item is None else (lambda xs: [item(x) for x in xs])
    if kind == "map":
        val = _avro_converter(schema["values"], named, ns)
        return None if val is None else (lambda m: {k: val(v) for k, v in m.items()})
    if kind in ("record", "error", "enum", "fixed"):
        name = str(schema["name"])
        space = schema.get("namespace", ns)
        full = name if "." in name or not space else f"{space}.{name}"
        named[full] = schema
        if kind != "record" and kind != "error":
            return None
        inner_ns = full.rsplit(".", 1)[0] if "." in full else None
        convs = {
            f["name"]: c
            for f in schema["fields"]
            if (c := _avro_converter(f["type"], named, inner_ns)) is not None
        }
        if not convs:
            return None
        return lambda d: {
            k: (convs[k](v) if k in convs and v is not None else v) for k, v in d.items()
        }
    if isinstance(kind, list | dict):
        return _avro_converter(kind, named, ns)
    return None


_PY_OF = {
    "boolean": (bool,), "int": (int,), "long": (int,), "float": (float,), "double": (float,),
    "string": (str,), "bytes": (bytes,), "enum": (str,), "fixed": (bytes,),
    "array": (list,), "map": (dict,), "record": (dict,), "error": (dict,),
}  # fmt: skip


def _union_converter(branches: list[Any], named: dict[str, Any], ns: str | None) -> Convert:
    entries = []
    for b in branches:
        kind = b if isinstance(b, str) else b.get("type")
        if isinstance(kind, str) and kind not in _PY_OF and kind in named:
            kind = named[kind].get("type")
        if isinstance(b, str) and b in named:
            kind = named[b].get("type")
        name = union_branch_name(b)
        entries.append((name, _PY_OF.get(str(kind), (object,)), _avro_converter(b, named, ns)))

    def convert(v: Any) -> Any:
        if v is None:
            return None
        if isinstance(v, tuple) and len(v) == 2:  # (record name, record) of a union
            rname, rec = v
            for name, _types, conv in entries:
                if name == str(rname).rsplit(".", 1)[-1]:
                    return {name: conv(rec) if conv else rec}
        for name, types, conv in entries:
            if isinstance(v, types) and not (isinstance(v, bool) and bool not in types):
                return {name: conv(v) if conv else v}
        raise WireFormatError(f"union value of type {type(v).__name__} matches no branch")

    return convert


class AvroDecoder:
    def __init__(
        self, schema: RegistrySchema, refs: tuple[RegistrySchema, ...], names: tuple[str, ...] = ()
    ) -> None:
        del names
        import fastavro

        named: dict[str, Any] = {}
        conv_named: dict[str, Any] = {}
        for ref in refs:
            doc = json.loads(ref.schema)
            fastavro.parse_schema(doc, named_schemas=named)
            _avro_converter(doc, conv_named)
        doc = json.loads(schema.schema)
        self.parsed = fastavro.parse_schema(doc, named_schemas=named)
        self.convert = _avro_converter(doc, conv_named)

    def __call__(self, data: bytes, pos: int) -> Any:
        from fastavro import schemaless_reader

        stream = io.BytesIO(data)
        stream.seek(pos)
        value = schemaless_reader(
            stream, self.parsed, None,
            return_record_name=True, return_record_name_override=True,
        )  # fmt: skip
        return self.convert(value) if self.convert is not None else value


# ---------------------------------------------------------------------------- Protobuf


def proto_pool(
    schema: RegistrySchema, refs: tuple[RegistrySchema, ...], ref_names: tuple[str, ...] = ()
) -> tuple[Any, Any]:
    """(descriptor pool, FileDescriptor) of a registered schema: a base64
    FileDescriptorProto, or ``.proto`` text (converted, its imports resolved in the pool;
    a reference is named by its import path)."""
    from broker.registry.proto_descriptor import descriptor_pool_for

    names = [*ref_names, *(f"ref-{i}.proto" for i in range(len(ref_names), len(refs)))]
    files = [*zip(names, (r.schema for r in refs), strict=True), ("schema.proto", schema.schema)]
    try:
        pool, fdp = descriptor_pool_for(files)
        return pool, pool.FindFileByName(fdp.name)
    except Exception as exc:  # parse / build errors: this schema's records are dead letters
        raise WireFormatError(f"protobuf schema: {exc}") from exc


def proto_message(file_desc: Any, indexes: list[int]) -> Any:
    msgs = list(file_desc.message_types_by_name.values())
    desc = msgs[indexes[0]]
    for i in indexes[1:]:
        desc = desc.nested_types[i]
    return desc


def proto_to_py(msg: Any) -> Any:
    desc = msg.DESCRIPTOR
    if desc.full_name == "google.protobuf.Timestamp":
        return datetime.fromtimestamp(msg.seconds, UTC).replace(microsecond=msg.nanos // 1000)
    out: dict[str, Any] = {}
    for f in desc.fields:
        v = getattr(msg, f.name)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            vf = f.message_type.fields_by_name["value"]
            out[f.name] = {k: _pb_single(vf, v[k]) for k in v}
        elif f.is_repeated:
            out[f.name] = [_pb_single(f, x) for x in v]
        elif f.type == f.TYPE_MESSAGE:
            out[f.name] = proto_to_py(v) if msg.HasField(f.name) else None
        elif f.has_presence and not msg.HasField(f.name):
            out[f.name] = None  # optional / oneof member / proto2 field not set
        else:
            out[f.name] = _pb_single(f, v)
    return out


def _pb_single(f: Any, v: Any) -> Any:
    if f.type == f.TYPE_MESSAGE:
        return proto_to_py(v)
    if f.type == f.TYPE_ENUM:
        ev = f.enum_type.values_by_number.get(v)
        return ev.name if ev is not None else str(v)
    return v


class ProtoDecoder:
    def __init__(
        self, schema: RegistrySchema, refs: tuple[RegistrySchema, ...], names: tuple[str, ...] = ()
    ) -> None:
        from google.protobuf import message_factory

        self.pool, self.file = proto_pool(schema, refs, names)
        self.classes: dict[tuple[int, ...], Any] = {}
        self.factory = message_factory

    def __call__(self, data: bytes, pos: int) -> Any:
        indexes, pos = message_indexes(data, pos)
        cls = self.classes.get(tuple(indexes))
        if cls is None:
            try:
                desc = proto_message(self.file, indexes)
            except IndexError as exc:
                raise WireFormatError(f"message indexes {indexes} name no message") from exc
            cls = self.classes[tuple(indexes)] = self.factory.GetMessageClass(desc)
        try:
            return proto_to_py(cls.FromString(bytes(memoryview(data)[pos:])))
        except Exception as exc:
            raise WireFormatError(f"invalid protobuf payload: {exc}") from exc


# ---------------------------------------------------------------------------- JSON


class JsonDecoder:
    def __init__(
        self, schema: RegistrySchema, refs: tuple[RegistrySchema, ...], names: tuple[str, ...] = ()
    ) -> None:
        del schema, refs, names

    def __call__(self, data: bytes, pos: int) -> Any:
        try:
            return json.loads(memoryview(data)[pos:].tobytes())
        except ValueError as exc:
            raise WireFormatError(f"invalid JSON payload: {exc}") from exc


def coerce_json(value: Any, arrow_type: Any) -> Any:
    """A JSON value shaped for ``arrow_type`` (dates parsed, other values as JSON text)."""
    import pyarrow as pa

    if value is None:
        return None
    if pa.types.is_struct(arrow_type):
        if not isinstance(value, dict):
            raise WireFormatError(f"expected an object, got {type(value).__name__}")
        return {
            f.name: coerce_json(value.get(f.name), f.type) for f in arrow_type if f.name in value
        }
    if pa.types.is_map(arrow_type):
        return {str(k): coerce_json(v, arrow_type.item_type) for k, v in dict(value).items()}
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return [coerce_json(v, arrow_type.value_type) for v in value]
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    if pa.types.is_date(arrow_type):
        return date.fromisoformat(value) if isinstance(value, str) else value
    if pa.types.is_timestamp(arrow_type) and isinstance(value, str):
        ts = datetime.fromisoformat(value.replace("Z", "+00:00"))
        return ts if ts.tzinfo else ts.replace(tzinfo=UTC)
    if pa.types.is_floating(arrow_type) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


Decoder = Callable[[bytes, int], Any]
DECODERS: dict[
    str, Callable[[RegistrySchema, tuple[RegistrySchema, ...], tuple[str, ...]], Decoder]
] = {
    "AVRO": AvroDecoder,
    "PROTOBUF": ProtoDecoder,
    "JSON": JsonDecoder,
}
