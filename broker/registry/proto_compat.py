"""Protobuf schemas for the registry: parse (``.proto`` text or a base64
``FileDescriptorProto``, the form confluent-kafka's ProtobufSerializer registers) into a
small model, and the compatibility rules checked on it. docs/registry.md.

Rules (a subset of Confluent's, symmetric, so BACKWARD/FORWARD/FULL check the same):
package changed; message removed; a field number whose kind (scalar / message / enum /
map) changed; a scalar type changed outside its wire-compatible group ({int32, uint32,
int64, uint64, bool}, {sint32, sint64}, {fixed32, sfixed32}, {fixed64, sfixed64},
{string, bytes}); a message or enum type name changed; repeated <-> singular; a required
field added or removed (proto2); a field removed from a oneof that still exists. Added
and removed optional fields are compatible. Not checked: enum value changes, options,
nested imports' contents.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import descriptor_pb2

SCALARS = frozenset(
    {
        "double", "float", "int32", "int64", "uint32", "uint64", "sint32", "sint64",
        "fixed32", "fixed64", "sfixed32", "sfixed64", "bool", "string", "bytes",
    }
)  # fmt: skip
_GROUPS = (
    {"int32", "uint32", "int64", "uint64", "bool"},
    {"sint32", "sint64"},
    {"fixed32", "sfixed32"},
    {"fixed64", "sfixed64"},
    {"string", "bytes"},
)


class ProtoSchemaError(ValueError):
    """Neither valid ``.proto`` text nor a base64 FileDescriptorProto."""


@dataclass(frozen=True, slots=True)
class ProtoField:
    name: str
    kind: str  # scalar | message | enum | map
    type: str  # scalar name or full type name
    label: str  # optional | repeated | required
    oneof: str | None = None


@dataclass
class ProtoModel:
    package: str
    syntax: str
    messages: dict[str, dict[int, ProtoField]] = field(default_factory=dict)
    oneofs: dict[str, set[str]] = field(default_factory=dict)  # message -> oneof names
    descriptor: descriptor_pb2.FileDescriptorProto | None = None


def parse_proto(text: str) -> ProtoModel:
    """The model of a schema given as base64 descriptor or as ``.proto`` text."""
    stripped = text.strip()
    if "{" not in stripped and ";" not in stripped:
        try:
            raw = base64.b64decode(stripped, validate=True)
            fdp = descriptor_pb2.FileDescriptorProto()
            fdp.ParseFromString(raw)
        except (binascii.Error, ValueError, Exception) as exc:
            raise ProtoSchemaError(f"invalid protobuf descriptor: {exc}") from exc
        return from_descriptor(fdp)
    return from_text(text)


def _scalar_name(t: int) -> str:
    return descriptor_pb2.FieldDescriptorProto.Type.Name(t)[len("TYPE_") :].lower()


def from_descriptor(fdp: descriptor_pb2.FileDescriptorProto) -> ProtoModel:
    model = ProtoModel(fdp.package, fdp.syntax or "proto2", descriptor=fdp)
    prefix = f"{fdp.package}." if fdp.package else ""

    def walk(msg: descriptor_pb2.DescriptorProto, name: str) -> None:
        maps = {
            f"{name}.{n.name}": ",".join(_type_of(f) for f in n.field)
            for n in msg.nested_type
            if n.options.map_entry
        }
        fields: dict[int, ProtoField] = {}
        real_oneofs = {
            i for i, _o in enumerate(msg.oneof_decl)
            if not any(f.proto3_optional and f.oneof_index == i for f in msg.field)
        }  # fmt: skip
        model.oneofs[name] = {msg.oneof_decl[i].name for i in real_oneofs}
        for f in msg.field:
            tname = f.type_name.lstrip(".")
            if f.type == f.TYPE_MESSAGE and tname in maps:
                kind, label, tname = "map", "optional", maps[tname]
            elif f.type in (f.TYPE_MESSAGE, f.TYPE_GROUP):
                kind, label = "message", _label(f.label)
            elif f.type == f.TYPE_ENUM:
                kind, label = "enum", _label(f.label)
            else:
                kind, label = "scalar", _label(f.label)
                tname = _scalar_name(f.type)
            oneof = (
                msg.oneof_decl[f.oneof_index].name
                if f.HasField("oneof_index") and f.oneof_index in real_oneofs
                else None
            )
            fields[f.number] = ProtoField(f.name, kind, tname, label, oneof)
        model.messages[name] = fields
        for nested in msg.nested_type:
            if not nested.options.map_entry:
                walk(nested, f"{name}.{nested.name}")

    for msg in fdp.message_type:
        walk(msg, prefix + msg.name)
    return model


def _type_of(f: descriptor_pb2.FieldDescriptorProto) -> str:
    if f.type in (f.TYPE_MESSAGE, f.TYPE_ENUM, f.TYPE_GROUP):
        return f.type_name.lstrip(".")
    return _scalar_name(f.type)


def _label(label: int) -> str:
    return {1: "optional", 2: "required", 3: "repeated"}.get(label, "optional")


def _parse_text(text: str) -> Any:
    """proto-schema-parser's AST of ``text``; any syntax error raises ProtoSchemaError."""
    try:
        from proto_schema_parser.parser import Parser
    except ImportError as exc:  # pragma: no cover - pinned runtime dependency
        raise ProtoSchemaError("install proto-schema-parser to register .proto text") from exc
    from antlr4.error.ErrorListener import ErrorListener

    class _Raise(ErrorListener):
        def syntaxError(
            self, _r: object, _s: object, line: int, col: int, msg: str, _e: object
        ) -> None:  # noqa: N802,E501
            raise ProtoSchemaError(f"line {line}:{col}: {msg}")

    def strict(recognizer: Any) -> None:
        recognizer.removeErrorListeners()
        recognizer.addErrorListener(_Raise())

    try:
        return Parser(setup_lexer=strict, setup_parser=strict).parse(text)
    except ProtoSchemaError:
        raise
    except Exception as exc:
        raise ProtoSchemaError(f"invalid .proto text: {exc}") from exc


def from_text(text: str) -> ProtoModel:
    from proto_schema_parser import ast

    tree = _parse_text(text)
    package = next((e.name for e in tree.file_elements if isinstance(e, ast.Package)), "")
    model = ProtoModel(package, tree.syntax or "proto2")
    enums: set[str] = set()
    msgs: set[str] = set()
    prefix = f"{package}." if package else ""

    def names(elements: list[object], scope: str) -> None:
        for e in elements:
            if isinstance(e, ast.Message):
                msgs.add(scope + e.name)
                names(list(e.elements), f"{scope}{e.name}.")
            elif isinstance(e, ast.Enum):
                enums.add(scope + e.name)

    names(list(tree.file_elements), prefix)

    def resolve(tname: str, scope: str) -> tuple[str, str]:
        if tname.startswith("."):
            full = tname[1:]
            return ("enum" if full in enums else "message"), full
        parts = scope.rstrip(".").split(".") if scope else []
        for i in range(len(parts), -1, -1):
            cand = ".".join([*parts[:i], tname])
            if cand in enums:
                return "enum", cand
            if cand in msgs:
                return "message", cand
        return "message", tname  # imported: kept as written

    def walk(msg: object, name: str) -> None:
        fields: dict[int, ProtoField] = {}
        model.oneofs[name] = set()
        for e in msg.elements:  # type: ignore[attr-defined]
            if isinstance(e, ast.Field):
                fields[e.number] = _text_field(e, name, resolve, None)
            elif isinstance(e, ast.MapField):
                vtype = e.value_type
                fields[e.number] = ProtoField(e.name, "map", f"{e.key_type},{vtype}", "optional")
            elif isinstance(e, ast.OneOf):
                model.oneofs[name].add(e.name)
                for f in e.elements:
                    if isinstance(f, ast.Field):
                        fields[f.number] = _text_field(f, name, resolve, e.name)
            elif isinstance(e, ast.Message):
                walk(e, f"{name}.{e.name}")
        model.messages[name] = fields

    for e in tree.file_elements:
        if isinstance(e, ast.Message):
            walk(e, prefix + e.name)
    return model


def _text_field(f: object, scope: str, resolve: object, oneof: str | None) -> ProtoField:
    tname: str = f.type  # type: ignore[attr-defined]
    card = f.cardinality  # type: ignore[attr-defined]
    label = card.value.lower() if card is not None else "optional"
    name: str = f.name  # type: ignore[attr-defined]
    if tname in SCALARS:
        return ProtoField(name, "scalar", tname, label, oneof)
    kind, full = resolve(tname, scope + ".")  # type: ignore[operator]
    return ProtoField(name, kind, full, label, oneof)


def _same_group(a: str, b: str) -> bool:
    return a == b or any(a in g and b in g for g in _GROUPS)


def incompatibilities(new: ProtoModel, old: ProtoModel) -> list[str]:
    """Why ``new`` and ``old`` are not wire compatible (empty: they are)."""
    out: list[str] = []
    if new.package != old.package:
        out.append(f"package changed from {old.package!r} to {new.package!r}")
    for mname, ofields in old.messages.items():
        nfields = new.messages.get(mname)
        if nfields is None:
            out.append(f"message {mname} removed")
            continue
        for num, of in ofields.items():
            nf = nfields.get(num)
            where = f"{mname} field {num} ({of.name})"
            if nf is None:
                if of.oneof and of.oneof in new.oneofs.get(mname, set()):
                    out.append(f"{where} removed from oneof {of.oneof}")
                if of.label == "required":
                    out.append(f"{where}: required field removed")
                continue
            out += _field_changes(where, nf, of)
        for num, nf in nfields.items():
            if num not in ofields and nf.label == "required":
                out.append(f"{mname} field {num} ({nf.name}): required field added")
    return out


def _field_changes(where: str, nf: ProtoField, of: ProtoField) -> list[str]:
    if nf.kind != of.kind:
        return [f"{where}: kind changed from {of.kind} to {nf.kind}"]
    if nf.kind == "scalar" and not _same_group(nf.type, of.type):
        return [f"{where}: scalar type changed from {of.type} to {nf.type}"]
    if nf.kind != "scalar" and nf.type != of.type:
        return [f"{where}: type changed from {of.type} to {nf.type}"]
    if (nf.label == "repeated") != (of.label == "repeated"):
        return [f"{where}: changed between repeated and singular"]
    if (nf.label == "required") != (of.label == "required"):
        return [f"{where}: required changed"]
    return []
