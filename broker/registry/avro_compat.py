"""Avro schema resolution (reader/writer) for the registry's compatibility checks.

Implements the resolution rules of the Avro specification ("Schema Resolution") over the
schemas' JSON: primitives with the promotions int -> long/float/double, long ->
float/double, float -> double, string <-> bytes; records by unqualified name (or reader
aliases), reader fields missing from the writer need a default; enums need every writer
symbol unless the reader has a default; fixed by name and size; arrays, maps; unions on
either side. Logical types do not take part (as in Confluent's registry). docs/registry.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_PROMOTIONS = {
    "int": {"long", "float", "double"},
    "long": {"float", "double"},
    "float": {"double"},
    "string": {"bytes"},
    "bytes": {"string"},
}


class AvroSchemaError(ValueError):
    """The schema is not valid Avro (or names a type nobody defines)."""


@dataclass
class Names:
    """Named types (record, enum, fixed) by full name, as normalized nodes."""

    types: dict[str, dict[str, Any]] = field(default_factory=dict)


def _fullname(name: str, namespace: str | None) -> str:
    if "." in name or not namespace:
        return name
    return f"{namespace}.{name}"


def normalize(schema: Any, names: Names, namespace: str | None = None) -> dict[str, Any]:
    """A node tree of ``schema``: named types go into ``names``, later uses become refs."""
    if isinstance(schema, list):
        return {"type": "union", "branches": [normalize(b, names, namespace) for b in schema]}
    if isinstance(schema, str):
        if schema in PRIMITIVES:
            return {"type": schema}
        for cand in (_fullname(schema, namespace), schema):
            if cand in names.types:
                return {"type": "ref", "name": cand}
        raise AvroSchemaError(f"unknown type {schema!r}")
    if not isinstance(schema, dict) or "type" not in schema:
        raise AvroSchemaError(f"not an Avro schema: {str(schema)[:80]}")
    kind = schema["type"]
    if kind in PRIMITIVES:
        return {"type": kind}
    if kind == "array":
        return {"type": "array", "items": normalize(schema.get("items"), names, namespace)}
    if kind == "map":
        return {"type": "map", "values": normalize(schema.get("values"), names, namespace)}
    if kind in ("record", "error", "enum", "fixed"):
        return _named(schema, names, namespace)
    if isinstance(kind, list | dict) or isinstance(kind, str):
        return normalize(kind, names, namespace)
    raise AvroSchemaError(f"unknown type {kind!r}")


def _named(schema: dict[str, Any], names: Names, namespace: str | None) -> dict[str, Any]:
    name = schema.get("name")
    if not isinstance(name, str) or not name:
        raise AvroSchemaError(f"a {schema['type']} needs a name")
    ns = schema.get("namespace", namespace)
    full = _fullname(name, ns)
    inner_ns = full.rsplit(".", 1)[0] if "." in full else None
    node: dict[str, Any] = {
        "type": "record" if schema["type"] == "error" else schema["type"],
        "name": full,
        "aliases": [_fullname(a, inner_ns) for a in schema.get("aliases") or ()],
    }
    names.types[full] = node
    if node["type"] == "record":
        fields = []
        for f in schema.get("fields") or ():
            if not isinstance(f, dict) or "name" not in f or "type" not in f:
                raise AvroSchemaError(f"record {full}: bad field {str(f)[:60]}")
            entry = {
                "name": f["name"],
                "type": normalize(f["type"], names, inner_ns),
                "aliases": list(f.get("aliases") or ()),
            }
            if "default" in f:
                entry["default"] = f["default"]
            fields.append(entry)
        node["fields"] = fields
    elif node["type"] == "enum":
        node["symbols"] = list(schema.get("symbols") or ())
        if "default" in schema:
            node["default"] = schema["default"]
    else:
        node["size"] = int(schema.get("size", -1))
    return node


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


class _Resolver:
    def __init__(self, rnames: Names, wnames: Names) -> None:
        self.rnames = rnames
        self.wnames = wnames
        self.seen: set[tuple[str, str]] = set()

    def deref(self, node: Mapping[str, Any], names: Names) -> Mapping[str, Any]:
        return names.types[node["name"]] if node["type"] == "ref" else node

    def check(self, reader: Mapping[str, Any], writer: Mapping[str, Any], path: str) -> list[str]:
        r = self.deref(reader, self.rnames)
        w = self.deref(writer, self.wnames)
        if w["type"] == "union":
            out: list[str] = []
            for b in w["branches"]:
                out += self.check(r, b, path)
            return out
        if r["type"] == "union":
            for b in r["branches"]:
                if not self.check(b, w, path):
                    return []
            return [f"{path}: reader union has no branch for writer type {_desc(w)}"]
        if r["type"] != w["type"]:
            if w["type"] in _PROMOTIONS and r["type"] in _PROMOTIONS[w["type"]]:
                return []
            return [f"{path}: reader type {_desc(r)} cannot read writer type {_desc(w)}"]
        kind = r["type"]
        if kind == "array":
            return self.check(r["items"], w["items"], f"{path}[]")
        if kind == "map":
            return self.check(r["values"], w["values"], f"{path}{{}}")
        if kind in ("record", "enum", "fixed"):
            wshort = _short(w["name"])
            if wshort != _short(r["name"]) and wshort not in {_short(a) for a in r["aliases"]}:
                return [f"{path}: reader {kind} {r['name']} cannot read writer {w['name']}"]
        if kind == "record":
            return self._record(r, w, path)
        if kind == "enum":
            missing = [s for s in w["symbols"] if s not in r["symbols"]]
            if missing and "default" not in r:
                return [f"{path}: reader enum {r['name']} lacks writer symbols {missing}"]
        if kind == "fixed" and r["size"] != w["size"]:
            return [f"{path}: fixed {r['name']} size {w['size']} -> {r['size']}"]
        return []

    def _record(self, r: Mapping[str, Any], w: Mapping[str, Any], path: str) -> list[str]:
        pair = (r["name"], w["name"])
        if pair in self.seen:
            return []
        self.seen.add(pair)
        wfields = {f["name"]: f for f in w["fields"]}
        out: list[str] = []
        for rf in r["fields"]:
            wf = next((wfields[n] for n in [rf["name"], *rf["aliases"]] if n in wfields), None)
            where = f"{path}.{rf['name']}" if path else rf["name"]
            if wf is None:
                if "default" not in rf:
                    out.append(f"{where}: reader field has no default and the writer lacks it")
                continue
            out += self.check(rf["type"], wf["type"], where)
        return out


def _desc(node: Mapping[str, Any]) -> str:
    return str(node.get("name", node["type"]))


def incompatibilities(
    reader: Mapping[str, Any], rnames: Names, writer: Mapping[str, Any], wnames: Names
) -> list[str]:
    """Why data written with ``writer`` cannot be read with ``reader`` (empty: it can)."""
    return _Resolver(rnames, wnames).check(reader, writer, "")
