"""Compatibility rules of the registry (broker/registry: Avro resolution, Protobuf, JSON)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from broker.registry import schemas
from broker.registry.schemas import InvalidSchemaError, check, parse
from tests.fixtures.registry_schemas import proto_file


def avro(doc: Any) -> schemas.Parsed:
    return parse("AVRO", json.dumps(doc))


def rec(*fields: dict[str, Any], name: str = "R") -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": list(fields)}


A_INT = {"name": "a", "type": "int"}


@pytest.mark.parametrize(
    ("writer", "reader", "ok"),
    [
        ("int", "long", True),
        ("int", "double", True),
        ("long", "int", False),
        ("float", "double", True),
        ("double", "float", False),
        ("string", "bytes", True),
        ("bytes", "string", True),
        ("string", ["null", "string"], True),
        (["null", "string"], "string", False),
        (["int", "string"], ["long", "string", "null"], True),
        ({"type": "array", "items": "int"}, {"type": "array", "items": "long"}, True),
        ({"type": "map", "values": "long"}, {"type": "map", "values": "int"}, False),
        ({"type": "fixed", "name": "F", "size": 4},
         {"type": "fixed", "name": "F", "size": 8}, False),
    ],
)  # fmt: skip
def test_avro_field_type_resolution(writer: Any, reader: Any, ok: bool) -> None:
    w = avro(rec({"name": "a", "type": writer}))
    r = avro(rec({"name": "a", "type": reader}))
    assert (check("BACKWARD", r, [w]) == []) is ok


def test_avro_fields_defaults_aliases_enums() -> None:
    v1 = avro(rec(A_INT))
    with_default = avro(rec(A_INT, {"name": "b", "type": "string", "default": "x"}))
    no_default = avro(rec(A_INT, {"name": "b", "type": "string"}))
    assert check("BACKWARD", with_default, [v1]) == []
    assert "no default" in check("BACKWARD", no_default, [v1])[0]
    assert check("FORWARD", no_default, [v1]) == []  # old readers ignore the new field
    assert check("FULL", with_default, [v1]) == []
    assert check("FULL", no_default, [v1])
    renamed = avro(rec({"name": "z", "type": "int", "aliases": ["a"]}))
    assert check("BACKWARD", renamed, [v1]) == []
    other_name = avro(rec(A_INT, name="Q"))
    assert check("BACKWARD", other_name, [v1])
    e1 = avro(rec({"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}}))
    e2 = avro(rec({"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A"]}}))
    e3 = avro(
        rec({"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A"], "default": "A"}})
    )
    assert check("BACKWARD", e2, [e1]) and check("BACKWARD", e3, [e1]) == []
    assert check("BACKWARD", e1, [e2]) == []


def test_avro_transitive_and_recursive() -> None:
    v1 = avro(rec(A_INT))
    v2 = avro(rec({"name": "b", "type": "int", "default": 0}))  # drops a
    v3 = avro(rec({"name": "a", "type": "int", "default": 1}, {"name": "b", "type": "int"}))
    assert check("BACKWARD", v3, [v1, v2]) == []  # only against v2
    assert check("BACKWARD_TRANSITIVE", v3, [v1, v2])  # v1 lacks b, which has no default
    node = {"type": "record", "name": "Node", "fields": [
        {"name": "v", "type": "int"}, {"name": "next", "type": ["null", "Node"]}]}  # fmt: skip
    assert check("FULL", avro(node), [avro(node)]) == []


def test_avro_invalid() -> None:
    for bad in ("{not json", json.dumps({"type": "record", "fields": []}), '"Unknown"'):
        with pytest.raises(InvalidSchemaError):
            parse("AVRO", bad)


def test_protobuf_descriptor_and_text_agree() -> None:
    text = """syntax = "proto3"; package shop;
    message Reading { enum Kind { UNKNOWN = 0; TEMP = 1; }
      message Location { double lat = 1; double lon = 2; }
      string sensor = 1; double value = 2; int64 count = 3; Kind kind = 4;
      Location where = 5; repeated int32 samples = 6; }"""
    from_text = parse("PROTOBUF", text).model
    b64 = base64.b64encode(proto_file(1).SerializeToString()).decode()
    from_desc = parse("PROTOBUF", b64).model
    assert from_text.messages == from_desc.messages
    v2 = parse("PROTOBUF", base64.b64encode(proto_file(2).SerializeToString()).decode())
    v3 = parse("PROTOBUF", base64.b64encode(proto_file(3).SerializeToString()).decode())
    v1 = parse("PROTOBUF", text)
    assert check("FULL_TRANSITIVE", v2, [v1]) == []
    assert check("FORWARD", v3, [v2]) == [
        "shop.Reading field 1 (sensor): scalar type changed from string to int32"
    ]


@pytest.mark.parametrize(
    ("old", "new", "ok"),
    [
        ("int32 a = 1;", "int64 a = 1;", True),
        ("int32 a = 1;", "sint32 a = 1;", False),
        ("string a = 1;", "bytes a = 1;", True),
        ("string a = 1;", "repeated string a = 1;", False),
        ("string a = 1; int32 b = 2;", "string a = 1;", True),
        ("M2 a = 1;", "M3 a = 1;", False),
        ("oneof o { string a = 1; int32 b = 2; }", "oneof o { string a = 1; }", False),
    ],
)
def test_protobuf_rules(old: str, new: str, ok: bool) -> None:
    def p(body: str) -> schemas.Parsed:
        return parse(
            "PROTOBUF", f'syntax = "proto3"; message M {{ {body} }} message M2 {{}} message M3 {{}}'
        )

    assert (check("BACKWARD", p(new), [p(old)]) == []) is ok


def test_protobuf_invalid_text() -> None:
    with pytest.raises(InvalidSchemaError):
        parse("PROTOBUF", "message {")


@pytest.mark.parametrize(
    ("old", "new", "ok"),
    [
        ({"type": "integer"}, {"type": "number"}, True),
        ({"type": "number"}, {"type": "integer"}, False),
        ({"type": "object", "properties": {"a": {"type": "string"}}},
         {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}},
         True),
        ({"type": "object", "properties": {"a": {"type": "string"}}},
         {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}, False),
        ({"type": "object", "properties": {"a": {"type": "string"}}},
         {"type": "object", "properties": {}, "additionalProperties": False}, False),
        ({"enum": ["x", "y"]}, {"enum": ["x"]}, False),
        ({"type": "array", "items": {"type": "integer"}},
         {"type": "array", "items": {"type": "number"}}, True),
    ],
)  # fmt: skip
def test_json_rules(old: Any, new: Any, ok: bool) -> None:
    p_old, p_new = parse("JSON", json.dumps(old)), parse("JSON", json.dumps(new))
    assert (check("BACKWARD", p_new, [p_old]) == []) is ok


def test_fingerprint_ignores_json_formatting() -> None:
    from broker.meta.schema import RegistrySchema

    a = RegistrySchema("AVRO", '{"type": "string"}')
    b = RegistrySchema("AVRO", '{"type":"string"}')
    assert schemas.fingerprint(a) == schemas.fingerprint(b)
    assert schemas.fingerprint(a) != schemas.fingerprint(RegistrySchema("JSON", a.schema))
