"""The broker's built-in schema registry with real clients (docs/registry.md).

One broker (``--http``) serves the registry at ``http://127.0.0.1:PORT/registry``;
confluent-kafka's SchemaRegistryClient with its Avro, Protobuf and JSON serializers and
deserializers, PyPI's python-schema-registry-client, and raw HTTP for the error codes.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
from google.protobuf import descriptor_pb2

from tests.fixtures.broker import BrokerProcess, free_port, start_broker
from tests.fixtures.registry_schemas import (
    AVRO_V1,
    AVRO_V2,
    AVRO_V3,
    avro_text,
    proto_class,
)

pytestmark = pytest.mark.integration

sr = pytest.importorskip(
    "confluent_kafka.schema_registry",
    reason="needs confluent-kafka's schema registry dependencies (fastavro, httpx, authlib)",
)
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient  # noqa: E402
from confluent_kafka.schema_registry.error import SchemaRegistryError  # noqa: E402
from confluent_kafka.serialization import MessageField, SerializationContext  # noqa: E402


@pytest.fixture(scope="module")
def registry_broker(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[BrokerProcess, str]]:
    http = free_port()
    b = start_broker(
        tmp_path_factory.mktemp("registry-broker"), extra_args=("--http", f"127.0.0.1:{http}")
    )
    try:
        yield b, f"http://127.0.0.1:{http}/registry"
    finally:
        b.stop()


@pytest.fixture
def url(registry_broker: tuple[BrokerProcess, str]) -> str:
    return registry_broker[1]


@pytest.fixture
def client(url: str) -> Iterator[SchemaRegistryClient]:
    with SchemaRegistryClient({"url": url}) as c:
        yield c


def _subject(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}-value"


def http(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/vnd.schemaregistry.v1+json")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def _ctx(topic: str) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE)


def test_avro_serializer_evolution_and_409(client: SchemaRegistryClient, url: str) -> None:
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer

    topic = f"orders-{uuid.uuid4().hex[:8]}"
    subject = f"{topic}-value"
    rec = {
        "id": 1, "customer": "ann", "amount": Decimal("12.34"),
        "placed": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "day": date(2026, 1, 2),
        "status": "PAID", "tags": ["a"],
        "attrs": {"x": 1}, "address": {"city": "Oslo", "zip": None}, "qty": 3,
    }  # fmt: skip
    ser1 = AvroSerializer(client, avro_text(AVRO_V1))
    b1 = ser1(rec, _ctx(topic))
    ser2 = AvroSerializer(client, avro_text(AVRO_V2))
    b2 = ser2({**rec, "id": 2, "note": "hi"}, _ctx(topic))
    id1, id2 = int.from_bytes(b1[1:5], "big"), int.from_bytes(b2[1:5], "big")
    assert b1[0] == 0 and b2[0] == 0 and id1 != id2
    assert client.get_versions(subject) == [1, 2]
    latest = client.get_latest_version(subject)
    assert (latest.version, latest.schema_id) == (2, id2)
    de = AvroDeserializer(client)  # fetches the writer schemas by id from the registry
    assert de(b1, _ctx(topic))["customer"] == "ann"
    assert de(b2, _ctx(topic))["note"] == "hi"
    # an incompatible v3 is refused with 409, through the serializer and the client alike
    with pytest.raises(SchemaRegistryError) as err:
        AvroSerializer(client, avro_text(AVRO_V3))({**rec, "customer": 5}, _ctx(topic))
    assert err.value.http_status_code == 409 and err.value.error_code == 409
    assert client.get_versions(subject) == [1, 2]
    assert not client.test_compatibility(subject, Schema(avro_text(AVRO_V3), "AVRO"))
    # with NONE the same schema is accepted as version 3
    client.set_compatibility(subject, "NONE")
    assert client.get_compatibility(subject) == "NONE"
    id3 = client.register_schema(subject, Schema(avro_text(AVRO_V3), "AVRO"))
    assert id3 not in (id1, id2) and client.get_versions(subject) == [1, 2, 3]
    # the same schema under another subject gets the same id
    other = _subject("same")
    assert client.register_schema(other, Schema(avro_text(AVRO_V1), "AVRO")) == id1


def test_protobuf_serializer_evolution_and_409(client: SchemaRegistryClient, url: str) -> None:
    from confluent_kafka.schema_registry.protobuf import (
        ProtobufDeserializer,
        ProtobufSerializer,
    )

    topic = f"readings-{uuid.uuid4().hex[:8]}"
    subject = f"{topic}-value"
    conf = {"use.deprecated.format": False}
    v1, v2, v3 = proto_class(1), proto_class(2), proto_class(3)
    b1 = ProtobufSerializer(v1, client, conf)(v1(sensor="s1", value=1.5, count=7), _ctx(topic))
    b2 = ProtobufSerializer(v2, client, conf)(v2(sensor="s2", note="n"), _ctx(topic))
    assert client.get_versions(subject) == [1, 2]
    assert b1[0] == 0 and int.from_bytes(b1[1:5], "big") != int.from_bytes(b2[1:5], "big")
    got = ProtobufDeserializer(v2, {"use.deprecated.format": False})(b1, _ctx(topic))
    assert (got.sensor, got.value, got.count) == ("s1", 1.5, 7)
    with pytest.raises(SchemaRegistryError) as err:
        ProtobufSerializer(v3, client, conf)(v3(sensor=3), _ctx(topic))
    assert err.value.http_status_code == 409
    assert "scalar type changed" in str(err.value)
    # the registry serves the schema back by id in the form the client registered
    reg = client.get_latest_version(subject)
    assert reg.schema.schema_type == "PROTOBUF"


def test_protobuf_text_schemas(url: str) -> None:
    subject = _subject("prototext")
    v1 = 'syntax = "proto3"; package p; message M { string a = 1; int64 b = 2; }'
    v2 = 'syntax = "proto3"; package p; message M { string a = 1; int64 b = 2; bool c = 3; }'
    bad = 'syntax = "proto3"; package p; message M { double a = 1; int64 b = 2; }'
    ids = []
    for text, status in ((v1, 200), (v2, 200), (bad, 409), ("message {", 422)):
        code, body = http(
            "POST", f"{url}/subjects/{subject}/versions", {"schema": text, "schemaType": "PROTOBUF"}
        )
        assert code == status, body
        ids.append(body.get("id"))
    assert body["error_code"] == 42201
    # ?format=serialized (what confluent-kafka's ProtobufDeserializer asks for): text comes
    # back as a base64 FileDescriptorProto
    code, doc = http("GET", f"{url}/schemas/ids/{ids[1]}?format=serialized")
    fdp = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(doc["schema"]))
    assert (fdp.package, [f.name for f in fdp.message_type[0].field]) == ("p", ["a", "b", "c"])
    assert http("GET", f"{url}/schemas/ids/{ids[1]}")[1]["schema"] == v2


def test_json_schema_serializer(client: SchemaRegistryClient, url: str) -> None:
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer

    topic = f"events-{uuid.uuid4().hex[:8]}"
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Event", "type": "object",
        "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["name"],
    }  # fmt: skip
    data = JSONSerializer(json.dumps(schema), client)({"name": "x", "n": 3}, _ctx(topic))
    assert data[0] == 0
    assert JSONDeserializer(None, schema_registry_client=client)(data, _ctx(topic)) == {
        "name": "x",
        "n": 3,
    }
    narrowed = {**schema, "properties": {"name": {"type": "string"}, "n": {"type": "string"}}}
    with pytest.raises(SchemaRegistryError) as err:
        client.register_schema(f"{topic}-value", Schema(json.dumps(narrowed), "JSON"))
    assert err.value.http_status_code == 409


def test_references_avro(client: SchemaRegistryClient, url: str) -> None:
    from confluent_kafka.schema_registry import SchemaReference

    addr = _subject("address")
    client.register_schema(
        addr,
        Schema(json.dumps({"type": "record", "name": "Addr", "namespace": "x",
                           "fields": [{"name": "city", "type": "string"}]}), "AVRO"),
    )  # fmt: skip
    person = {"type": "record", "name": "Person", "namespace": "x",
              "fields": [{"name": "home", "type": "Addr"}]}  # fmt: skip
    subject = _subject("person")
    sid = client.register_schema(
        subject, Schema(json.dumps(person), "AVRO", [SchemaReference("x.Addr", addr, 1)])
    )
    got = client.get_schema(sid)
    assert [(r.name, r.subject, r.version) for r in got.references or []] == [("x.Addr", addr, 1)]
    code, body = http("GET", f"{url}/subjects/{addr}/versions/1/referencedby")
    assert (code, body) == (200, [sid])
    # without the reference the type is unknown: invalid schema
    code, body = http("POST", f"{url}/subjects/{subject}/versions", {"schema": json.dumps(person)})
    assert (code, body["error_code"]) == (422, 42201)


def test_error_codes_and_deletes(url: str) -> None:
    subject = _subject("errs")
    assert http("GET", f"{url}/subjects/{subject}/versions")[1]["error_code"] == 40401
    assert http("GET", f"{url}/schemas/ids/999999")[1]["error_code"] == 40403
    code, body = http("POST", f"{url}/subjects/{subject}/versions", {"schema": "{not avro"})
    assert (code, body["error_code"]) == (422, 42201)
    one = {"schema": json.dumps({"type": "record", "name": "R", "fields": []})}
    assert http("POST", f"{url}/subjects/{subject}/versions", one)[0] == 200
    assert http("GET", f"{url}/subjects/{subject}/versions/7")[1]["error_code"] == 40402
    assert http("GET", f"{url}/subjects/{subject}/versions/abc")[1]["error_code"] == 42202
    assert (
        http("PUT", f"{url}/config/{subject}", {"compatibility": "SIDEWAYS"})[1]["error_code"]
        == 42203
    )
    assert http("GET", f"{url}/config/{subject}")[1]["error_code"] == 40408
    code, found = http("POST", f"{url}/subjects/{subject}", one)
    assert code == 200 and found["version"] == 1
    other = {"schema": json.dumps({"type": "record", "name": "Q", "fields": []})}
    assert http("POST", f"{url}/subjects/{subject}", other)[1]["error_code"] == 40403
    # permanent delete needs a soft delete first; ids stay unique afterwards
    assert http("DELETE", f"{url}/subjects/{subject}?permanent=true")[1]["error_code"] == 40405
    assert http("DELETE", f"{url}/subjects/{subject}") == (200, [1])
    assert http("DELETE", f"{url}/subjects/{subject}")[1]["error_code"] == 40404
    assert subject not in http("GET", f"{url}/subjects")[1]
    assert subject in http("GET", f"{url}/subjects?deleted=true")[1]
    assert http("DELETE", f"{url}/subjects/{subject}?permanent=true") == (200, [1])
    assert http("GET", f"{url}/subjects/{subject}/versions")[1]["error_code"] == 40401


def test_compatibility_levels(url: str) -> None:
    subject = _subject("levels")
    base = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}
    add_req = {**base, "fields": [*base["fields"], {"name": "b", "type": "string"}]}
    assert http("PUT", f"{url}/config/{subject}", {"compatibility": "FORWARD"})[0] == 200
    assert (
        http("POST", f"{url}/subjects/{subject}/versions", {"schema": json.dumps(base)})[0] == 200
    )
    # FORWARD: old readers must read new data; adding a required field is fine there
    code, body = http(
        "POST", f"{url}/compatibility/subjects/{subject}/versions/latest?verbose=true",
        {"schema": json.dumps(add_req)},
    )  # fmt: skip
    assert (code, body["is_compatible"]) == (200, True)
    assert http("PUT", f"{url}/config/{subject}", {"compatibility": "FULL"})[0] == 200
    code, body = http(
        "POST", f"{url}/compatibility/subjects/{subject}/versions?verbose=true",
        {"schema": json.dumps(add_req)},
    )  # fmt: skip
    assert body["is_compatible"] is False and body["messages"]
    assert http("GET", f"{url}/config/{subject}")[1] == {"compatibilityLevel": "FULL"}
    assert http("DELETE", f"{url}/config/{subject}")[0] == 200
    assert http("GET", f"{url}/config")[1] == {"compatibilityLevel": "BACKWARD"}


def test_python_schema_registry_client(url: str) -> None:
    from schema_registry.client import SchemaRegistryClient as PyClient
    from schema_registry.client import schema as pyschema

    client = PyClient(url=url)
    subject = _subject("pyclient")
    v1 = pyschema.AvroSchema(AVRO_V1)
    sid = client.register(subject, v1)
    by_id, latest, checked = (
        client.get_by_id(sid),
        client.get_schema(subject),
        client.check_version(subject, v1),
    )
    assert by_id is not None and latest is not None and checked is not None
    assert by_id.raw_schema["name"] == "Order"
    assert client.get_versions(subject) == [1]
    assert latest.schema_id == sid
    assert checked.version == 1
    assert client.test_compatibility(subject, pyschema.AvroSchema(AVRO_V2)) is True
    assert client.test_compatibility(subject, pyschema.AvroSchema(AVRO_V3)) is False
    assert client.update_compatibility("FULL", subject)
    assert client.get_compatibility(subject) == "FULL"
    assert client.get_compatibility() == "BACKWARD"
    js = pyschema.JsonSchema({"type": "object", "properties": {"a": {"type": "string"}}})
    assert client.register(_subject("pyjson"), js) > 0
    assert client.delete_subject(subject) == [1]


def test_store_survives_restart(registry_broker: tuple[BrokerProcess, str]) -> None:
    b, url = registry_broker
    subject = _subject("restart")
    code, body = http("POST", f"{url}/subjects/{subject}/versions", {"schema": avro_text(AVRO_V1)})
    assert code == 200
    b.restart()
    _wait_http(url)
    assert http("GET", f"{url}/subjects/{subject}/versions/1")[1]["id"] == body["id"]
    code, again = http(
        "POST", f"{url}/subjects/{_subject('restart2')}/versions", {"schema": avro_text(AVRO_V3)}
    )
    assert code == 200 and again["id"] > body["id"]


def _wait_http(url: str) -> None:
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # start-up only: the HTTP listener comes up first
        try:
            http("GET", f"{url}/schemas/types")
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("registry did not come back")
