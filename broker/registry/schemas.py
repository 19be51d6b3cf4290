"""Schema types of the registry: validation, fingerprints, compatibility (docs/registry.md).

``parse(kind, text, refs)`` validates a schema given its resolved references (each a
``(name, RegistrySchema)`` pair, references first) and returns a :class:`Parsed` the
compatibility rules work on; an invalid schema raises :class:`InvalidSchemaError`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from broker.meta.schema import RegistrySchema
from broker.registry import avro_compat, json_compat, proto_compat

SCHEMA_TYPES = ("AVRO", "PROTOBUF", "JSON")
LEVELS = (
    "NONE",
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
)


class InvalidSchemaError(ValueError):
    """Not a valid schema of its type (registry error 42201)."""


@dataclass(frozen=True)
class Parsed:
    schema_type: str
    model: Any  # AVRO: (node, Names); PROTOBUF: ProtoModel; JSON: the document


def fingerprint(schema: RegistrySchema) -> str:
    """Identity of (type, schema, references): same fingerprint, same id (across subjects)."""
    text = schema.schema
    if schema.schema_type in ("AVRO", "JSON"):
        try:
            text = json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
        except ValueError:
            pass
    else:
        text = text.strip()
    refs = [[r.name, r.subject, r.version] for r in schema.references]
    doc = json.dumps([schema.schema_type, text, refs], separators=(",", ":"))
    return hashlib.sha256(doc.encode()).hexdigest()


def _avro(text: str, refs: Sequence[RegistrySchema]) -> Parsed:
    import fastavro
    from fastavro.schema import SchemaParseException, UnknownType

    names = avro_compat.Names()
    fa_named: dict[str, Any] = {}
    try:
        for ref in refs:
            doc = json.loads(ref.schema)
            fastavro.parse_schema(doc, named_schemas=fa_named)
            avro_compat.normalize(doc, names)
        doc = json.loads(text)
        fastavro.parse_schema(doc, named_schemas=fa_named)
        node = avro_compat.normalize(doc, names)
    except (ValueError, SchemaParseException, UnknownType, TypeError, KeyError) as exc:
        raise InvalidSchemaError(f"Invalid schema: {exc}") from exc
    return Parsed("AVRO", (node, names))


def _json(text: str) -> Parsed:
    import jsonschema
    import jsonschema.exceptions
    import jsonschema.validators

    try:
        doc = json.loads(text)
        if not isinstance(doc, dict | bool):
            raise InvalidSchemaError("Invalid schema: a JSON schema is an object or a boolean")
        cls = jsonschema.validators.validator_for(doc, default=jsonschema.Draft7Validator)
        cls.check_schema(doc)
    except (ValueError, jsonschema.exceptions.SchemaError) as exc:
        raise InvalidSchemaError(f"Invalid schema: {exc}") from exc
    return Parsed("JSON", doc)


def parse(schema_type: str, text: str, refs: Sequence[RegistrySchema] = ()) -> Parsed:
    if schema_type == "AVRO":
        return _avro(text, refs)
    if schema_type == "JSON":
        return _json(text)
    if schema_type == "PROTOBUF":
        try:
            return Parsed("PROTOBUF", proto_compat.parse_proto(text))
        except proto_compat.ProtoSchemaError as exc:
            raise InvalidSchemaError(f"Invalid schema: {exc}") from exc
    raise InvalidSchemaError(f"Invalid schema type {schema_type}")


def _can_read(reader: Parsed, writer: Parsed) -> list[str]:
    if reader.schema_type != writer.schema_type:
        return [f"schema type changed from {writer.schema_type} to {reader.schema_type}"]
    if reader.schema_type == "AVRO":
        (rnode, rnames), (wnode, wnames) = reader.model, writer.model
        return avro_compat.incompatibilities(rnode, rnames, wnode, wnames)
    if reader.schema_type == "JSON":
        return json_compat.incompatibilities(reader.model, writer.model)
    return proto_compat.incompatibilities(reader.model, writer.model)


def check(level: str, new: Parsed, existing: Sequence[Parsed]) -> list[str]:
    """Why ``new`` breaks ``level`` against ``existing`` versions (oldest first)."""
    if level == "NONE" or not existing:
        return []
    against = existing if level.endswith("_TRANSITIVE") else existing[-1:]
    base = level.removesuffix("_TRANSITIVE")
    out: list[str] = []
    for old in reversed(against):
        if new.schema_type == "PROTOBUF" == old.schema_type:  # the rules are symmetric
            out += _can_read(new, old)
            continue
        if base in ("BACKWARD", "FULL"):
            out += _can_read(new, old)
        if base in ("FORWARD", "FULL"):
            out += _can_read(old, new)
    return out
