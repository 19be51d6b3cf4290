"""JSON Schema compatibility for the registry (a documented subset, docs/registry.md).

``incompatibilities(reader, writer)`` lists why a document valid under ``writer`` may be
rejected by ``reader``: a type narrowed (``integer`` widens to ``number``), a property
made required that was not, a property removed from a closed object
(``additionalProperties: false``), enum values removed, and the same rules recursively
in ``properties``, ``items`` and ``additionalProperties``. Adding a property is taken as
compatible (Confluent reports it for open content models). Keywords like ``minimum``,
``pattern`` or ``$ref`` targets are not compared.
"""

from __future__ import annotations

from typing import Any

_ALL_TYPES = frozenset({"null", "boolean", "object", "array", "number", "string", "integer"})


def _types(schema: Any) -> set[str]:
    if schema is True or not isinstance(schema, dict):
        return set(_ALL_TYPES)
    t = schema.get("type")
    if t is None:
        if "properties" in schema:
            return {"object"}
        return set(_ALL_TYPES)
    return {t} if isinstance(t, str) else set(t)


def incompatibilities(reader: Any, writer: Any, path: str = "$") -> list[str]:
    if reader is True or reader == {}:
        return []
    if reader is False:
        return [] if writer is False else [f"{path}: reader rejects everything"]
    if not isinstance(reader, dict) or not isinstance(writer, dict):
        return []
    out: list[str] = []
    rt, wt = _types(reader), _types(writer)
    if "number" in rt:
        rt.add("integer")
    lost = wt - rt
    if lost:
        out.append(f"{path}: type narrowed, {sorted(lost)} no longer accepted")
    if "enum" in reader:
        gone = [v for v in writer.get("enum", []) if v not in reader["enum"]]
        if gone or "enum" not in writer:
            out.append(f"{path}: enum narrowed")
    out += _object(reader, writer, path)
    if isinstance(reader.get("items"), dict) and "items" in writer:
        out += incompatibilities(reader["items"], writer["items"], f"{path}[]")
    return out


def _object(reader: dict[str, Any], writer: dict[str, Any], path: str) -> list[str]:
    out: list[str] = []
    rprops: dict[str, Any] = reader.get("properties") or {}
    wprops: dict[str, Any] = writer.get("properties") or {}
    newly_required = set(reader.get("required") or ()) - set(writer.get("required") or ())
    out += [f"{path}.{n}: property became required" for n in sorted(newly_required)]
    closed = reader.get("additionalProperties") is False
    for name, wschema in wprops.items():
        if name in rprops:
            out += incompatibilities(rprops[name], wschema, f"{path}.{name}")
        elif closed:
            out.append(f"{path}.{name}: property removed from a closed object")
        elif isinstance(reader.get("additionalProperties"), dict):
            out += incompatibilities(reader["additionalProperties"], wschema, f"{path}.{name}")
    if closed and writer.get("additionalProperties") is not False:
        out.append(f"{path}: object closed (additionalProperties false)")
    return out
