"""``.proto`` text -> ``FileDescriptorProto`` (what Java and Go serializers register), so
the ingest job can decode their messages. docs/registry.md, "Protobuf".

Covers proto2 / proto3 messages (nested), enums, scalar / message / enum fields with
repeated, required and proto3 ``optional`` labels, maps, oneofs, package and imports
(type names resolve against the file itself and a descriptor pool holding the imports).
Options, extensions, groups and services are not carried over.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2

from broker.registry.proto_compat import SCALARS, ProtoSchemaError, _parse_text

F = descriptor_pb2.FieldDescriptorProto
_SCALAR_TYPES = {name: getattr(F, f"TYPE_{name.upper()}") for name in SCALARS}


def _camel(name: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in name.split("_"))


class _Builder:
    def __init__(self, tree: Any, filename: str, pool: Any) -> None:
        from proto_schema_parser import ast

        self.ast = ast
        self.tree = tree
        self.pool = pool
        self.package = next((e.name for e in tree.file_elements if isinstance(e, ast.Package)), "")
        self.syntax = tree.syntax or "proto2"
        self.fdp = descriptor_pb2.FileDescriptorProto(
            name=filename, package=self.package, syntax=self.syntax
        )
        self.messages: set[str] = set()
        self.enums: set[str] = set()

    def collect(self, elements: list[Any], scope: str) -> None:
        for e in elements:
            if isinstance(e, self.ast.Message):
                self.messages.add(scope + e.name)
                self.collect(list(e.elements), f"{scope}{e.name}.")
            elif isinstance(e, self.ast.Enum):
                self.enums.add(scope + e.name)

    def resolve(self, tname: str, scope: str) -> tuple[int, str]:
        """(TYPE_MESSAGE | TYPE_ENUM, ".full.name") of a type named in ``scope``."""
        if tname.startswith("."):
            cands = [tname[1:]]
        else:
            parts = scope.split(".") if scope else []
            cands = [".".join([*parts[:i], tname]) for i in range(len(parts), -1, -1)]
        for cand in cands:
            if cand in self.enums:
                return F.TYPE_ENUM, "." + cand
            if cand in self.messages:
                return F.TYPE_MESSAGE, "." + cand
            for find, kind in (
                (self.pool.FindMessageTypeByName, F.TYPE_MESSAGE),
                (self.pool.FindEnumTypeByName, F.TYPE_ENUM),
            ):
                try:
                    find(cand)
                    return kind, "." + cand
                except KeyError:
                    pass
        raise ProtoSchemaError(f"unknown type {tname!r} (in {scope or 'the file'})")

    def field(self, e: Any, scope: str, oneof: int | None) -> Any:
        f = F(name=e.name, number=e.number, json_name=_json_name(e.name))
        card = e.cardinality.value if e.cardinality is not None else None
        f.label = {"REPEATED": F.LABEL_REPEATED, "REQUIRED": F.LABEL_REQUIRED}.get(
            card or "", F.LABEL_OPTIONAL
        )
        if e.type in _SCALAR_TYPES:
            f.type = _SCALAR_TYPES[e.type]
        else:
            f.type, f.type_name = self.resolve(e.type, scope)
        if oneof is not None:
            f.oneof_index = oneof
        return f

    def message(self, e: Any, scope: str) -> descriptor_pb2.DescriptorProto:
        full = f"{scope}.{e.name}" if scope else e.name
        msg = descriptor_pb2.DescriptorProto(name=e.name)
        synthetic: list[int] = []  # positions in msg.field (append copies the message)
        for el in e.elements:
            if isinstance(el, self.ast.Field):
                f = self.field(el, full, None)
                if (
                    self.syntax == "proto3"
                    and el.cardinality is not None
                    and el.cardinality.value == "OPTIONAL"
                ):
                    f.proto3_optional = True
                    synthetic.append(len(msg.field))
                msg.field.append(f)
            elif isinstance(el, self.ast.MapField):
                entry = msg.nested_type.add(name=_camel(el.name) + "Entry")
                entry.options.map_entry = True
                for num, (fname, ftype) in enumerate(
                    (("key", el.key_type), ("value", el.value_type)), 1
                ):
                    sub = self.field(self.ast.Field(name=fname, number=num, type=ftype), full, None)
                    entry.field.append(sub)
                msg.field.append(F(
                    name=el.name, number=el.number, label=F.LABEL_REPEATED, type=F.TYPE_MESSAGE,
                    type_name=f".{full}.{entry.name}", json_name=_json_name(el.name),
                ))  # fmt: skip
            elif isinstance(el, self.ast.OneOf):
                index = len(msg.oneof_decl)
                msg.oneof_decl.add(name=el.name)
                for member in el.elements:
                    if isinstance(member, self.ast.Field):
                        msg.field.append(self.field(member, full, index))
            elif isinstance(el, self.ast.Message):
                msg.nested_type.append(self.message(el, full))
            elif isinstance(el, self.ast.Enum):
                msg.enum_type.append(self.enum(el))
        for pos in synthetic:  # proto3 optional: a synthetic oneof each, declared last
            msg.field[pos].oneof_index = len(msg.oneof_decl)
            msg.oneof_decl.add(name=f"_{msg.field[pos].name}")
        return msg

    def enum(self, e: Any) -> descriptor_pb2.EnumDescriptorProto:
        out = descriptor_pb2.EnumDescriptorProto(name=e.name)
        for v in e.elements:
            if isinstance(v, self.ast.EnumValue):
                out.value.add(name=v.name, number=v.number)
        return out

    def build(self) -> descriptor_pb2.FileDescriptorProto:
        prefix = f"{self.package}." if self.package else ""
        self.collect(list(self.tree.file_elements), prefix)
        for e in self.tree.file_elements:
            if isinstance(e, self.ast.Import):
                self.fdp.dependency.append(e.name)
            elif isinstance(e, self.ast.Message):
                self.fdp.message_type.append(self.message(e, self.package))
            elif isinstance(e, self.ast.Enum):
                self.fdp.enum_type.append(self.enum(e))
        return self.fdp


def _json_name(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def descriptor_pool_for(files: list[tuple[str, str]]) -> tuple[Any, Any]:
    """(pool, the last file's FileDescriptorProto): the well-known types and ``files``
    ((import path, base64 descriptor or text), dependencies first) added."""
    import base64

    from google.protobuf import (
        any_pb2,
        descriptor_pool,
        duration_pb2,
        empty_pb2,
        field_mask_pb2,
        struct_pb2,
        timestamp_pb2,
        wrappers_pb2,
    )  # fmt: skip

    pool = descriptor_pool.DescriptorPool()
    known = set()
    for mod in (any_pb2, duration_pb2, empty_pb2, field_mask_pb2, struct_pb2, timestamp_pb2,
                wrappers_pb2, descriptor_pb2):  # fmt: skip
        pool.AddSerializedFile(mod.DESCRIPTOR.serialized_pb)
        known.add(mod.DESCRIPTOR.name)
    fdp = descriptor_pb2.FileDescriptorProto()
    for name, text in files:
        text = text.strip()
        if "{" in text or ";" in text:
            fdp = text_to_descriptor(text, name, pool)
        else:
            fdp = descriptor_pb2.FileDescriptorProto()
            fdp.ParseFromString(base64.b64decode(text))
        if fdp.name not in known:
            known.add(fdp.name)
            pool.Add(fdp)
    return pool, fdp


def text_to_descriptor(text: str, filename: str, pool: Any) -> descriptor_pb2.FileDescriptorProto:
    """The FileDescriptorProto of ``.proto`` text whose imports are already in ``pool``."""
    return _Builder(_parse_text(text), filename, pool).build()
