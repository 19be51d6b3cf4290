"""Typed tables: confluent-kafka's Avro and Protobuf serializers -> the broker (with its
registry) -> the ingest job on Spark -> Iceberg, read back with pyiceberg and DuckDB.

The schemas evolve through the broker's registry (v1, v2 adding an optional field, v3
refused with 409); the job maps the registry's versions to columns (docs/ingest.md).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ingest_job import catalog as cat
from ingest_job.job import IngestConfig, IngestSummary, run_ingest
from tests.fixtures.broker import BrokerProcess, free_port, start_broker
from tests.fixtures.registry_schemas import AVRO_V1, AVRO_V2, AVRO_V3, avro_text, proto_class
from tests.integration.conftest import create_topic

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.integration, pytest.mark.spark]

pytest.importorskip("confluent_kafka.schema_registry.avro", reason="needs fastavro, httpx")


@dataclass
class Env:
    broker: BrokerProcess
    registry: str
    data: Path

    def cfg(self, topics: tuple[str, ...], **kw: Any) -> IngestConfig:
        return IngestConfig(
            topics=topics, store_url=f"file://{self.data}", data_dir=str(self.data),
            master="local[2]", progress_interval=1.0, partition_by="none", **kw,
        )  # fmt: skip

    def rows(self, table: str) -> list[dict[str, Any]]:
        catalog = cat.open_catalog(None, str(self.data))
        rows = catalog.load_table(("kafscale", table)).scan().to_arrow().to_pylist()
        return sorted(rows, key=lambda r: (r["partition"], r["offset"]))

    def duckdb(self, table: str, columns: str) -> list[tuple[Any, ...]]:
        import duckdb
        import duckdb_extension_avro
        import duckdb_extension_iceberg

        catalog = cat.open_catalog(None, str(self.data))
        location = catalog.load_table(("kafscale", table)).metadata_location
        con = duckdb.connect()
        for mod, name in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")):
            (path,) = (Path(mod.__file__).parent / "extensions").glob(f"*/{name}.duckdb_extension")
            con.execute(f"LOAD '{path}'")
        return con.execute(
            f"SELECT {columns} FROM iceberg_scan('{location.removeprefix('file://')}') "
            'ORDER BY "partition", "offset"'
        ).fetchall()


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    work = tmp_path_factory.mktemp("typed")
    http = free_port()
    b = start_broker(work, extra_args=("--http", f"127.0.0.1:{http}"))
    try:
        yield Env(b, f"http://127.0.0.1:{http}/registry", work / "data")
    finally:
        b.stop()


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    from ingest_job.spark import get_spark

    session = get_spark("local[2]")
    yield session
    session.stop()


def _produce(env: Env, topic: str, values: list[bytes]) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": env.broker.bootstrap, "acks": "all", "linger.ms": 5})
    for i, v in enumerate(values):
        p.produce(topic, value=v, key=f"k{i}".encode())
    assert p.flush(30) == 0


def _run(spark: SparkSession, cfg: IngestConfig) -> IngestSummary:
    return run_ingest(cfg, spark, lambda _line: None)


def _order(i: int, **extra: Any) -> dict[str, Any]:
    return {
        "id": i, "customer": f"c{i}", "amount": Decimal(f"{i}.25"),
        "placed": datetime(2026, 1, 2, 3, 4, i, 123456, tzinfo=UTC), "day": date(2026, 1, i + 1),
        "status": ["NEW", "PAID", "SHIPPED"][i % 3], "tags": [f"t{i}"] * (i % 3),
        "attrs": {"n": i}, "address": None if i % 2 else {"city": f"city{i}", "zip": None},
        "qty": i * 10, **extra,
    }  # fmt: skip


def test_avro_typed_table(env: Env, spark: SparkSession) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.schema_registry.error import SchemaRegistryError
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = f"orders-{uuid.uuid4().hex[:6]}"
    create_topic(env.broker.bootstrap, topic, 1)
    ctx = SerializationContext(topic, MessageField.VALUE)
    with SchemaRegistryClient({"url": env.registry}) as client:
        v1 = AvroSerializer(client, avro_text(AVRO_V1))
        v2 = AvroSerializer(client, avro_text(AVRO_V2))
        values = [v1(_order(i), ctx) for i in range(4)]
        _produce(env, topic, values)
        s1 = _run(spark, env.cfg((topic,), value_format="avro"))
        assert (s1.rows, s1.dead_letters) == (4, 0)
        values2 = [v2(_order(i, note=f"n{i}"), ctx) for i in range(4, 7)]
        with pytest.raises(SchemaRegistryError) as err:
            AvroSerializer(client, avro_text(AVRO_V3))(_order(9, customer=9), ctx)
        assert err.value.http_status_code == 409
    _produce(env, topic, [*values2, b"not avro", None])  # type: ignore[list-item]
    s2 = _run(spark, env.cfg((topic,), value_format="avro"))
    assert (s2.rows, s2.dead_letters) == (5, 1)  # 3 v2 records + a tombstone; 1 dead letter
    rows = env.rows(topic.replace("-", "_"))
    assert [r["offset"] for r in rows] == [0, 1, 2, 3, 4, 5, 6, 8]  # 7 is a dead letter
    for i, r in enumerate(rows[:7]):
        want = _order(i, note=f"n{i}" if i >= 4 else None)
        got = {k: r[k] for k in want}
        got["attrs"] = dict(got["attrs"])
        assert got == want, i
    assert rows[7]["id"] is None and rows[7]["value"] is None  # the tombstone
    dead = env.rows(topic.replace("-", "_") + "_dead_letters")
    assert [(d["offset"], d["value"]) for d in dead] == [(7, b"not avro")]
    assert "wire format" in dead[0]["error"]
    duck = env.duckdb(
        topic.replace("-", "_"),
        '"offset", id, customer, amount, epoch_us(placed), day, status, tags, '
        "address.city, qty, note",
    )
    for i, row in enumerate(duck[:7]):
        o = _order(i)
        city = None if o["address"] is None else o["address"]["city"]
        want_row = (
            i, i, f"c{i}", o["amount"], int(o["placed"].timestamp() * 1e6), o["day"],
            o["status"], o["tags"], city, i * 10, f"n{i}" if i >= 4 else None,
        )  # fmt: skip
        assert row == want_row
    # the table's columns follow the registry: v2's optional field is a column
    catalog = cat.open_catalog(None, str(env.data))
    schema = catalog.load_table(("kafscale", topic.replace("-", "_"))).schema()
    assert str(schema.find_field("amount").field_type) == "decimal(10, 2)"
    assert str(schema.find_field("placed").field_type) == "timestamptz"
    assert schema.find_field("note") is not None


def test_protobuf_typed_table(env: Env, spark: SparkSession) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = f"readings-{uuid.uuid4().hex[:6]}"
    create_topic(env.broker.bootstrap, topic, 1)
    ctx = SerializationContext(topic, MessageField.VALUE)
    c1, c2 = proto_class(1), proto_class(2)
    conf = {"use.deprecated.format": False}
    with SchemaRegistryClient({"url": env.registry}) as client:
        s1, s2 = ProtobufSerializer(c1, client, conf), ProtobufSerializer(c2, client, conf)
        values = [
            s1(c1(sensor="a", value=1.5, count=2**40, kind=1, samples=[1, 2],
                  where=c1.Location(lat=1.0, lon=2.0)), ctx),
            s1(c1(sensor="b"), ctx),
            s2(c2(sensor="c", note="hello", value=-3.0), ctx),
        ]  # fmt: skip
    _produce(env, topic, values)
    s = _run(spark, env.cfg((topic,), value_format="protobuf"))
    assert (s.rows, s.dead_letters) == (3, 0)
    rows = env.rows(topic.replace("-", "_"))
    got = [  # the message field "value" is column value_value (Kafka has a value column)
        (r["sensor"], r["value_value"], r["count"], r["kind"], r["samples"], r["where"], r["note"])
        for r in rows
    ]
    assert got == [
        ("a", 1.5, 2**40, "TEMP", [1, 2], {"lat": 1.0, "lon": 2.0}, None),
        ("b", 0.0, 0, "UNKNOWN", [], None, None),
        ("c", -3.0, 0, "UNKNOWN", [], None, "hello"),
    ]
    duck = env.duckdb(topic.replace("-", "_"), 'sensor, "count", kind, "where".lat, note')
    assert duck == [("a", 2**40, "TEMP", 1.0, None), ("b", 0, "UNKNOWN", None, None),
                    ("c", 0, "UNKNOWN", None, "hello")]  # fmt: skip


def test_json_schema_typed_table(env: Env, spark: SparkSession) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = f"events-{uuid.uuid4().hex[:6]}"
    create_topic(env.broker.bootstrap, topic, 1)
    schema = {
        "type": "object", "title": "Event",
        "properties": {
            "name": {"type": "string"}, "n": {"type": "integer"},
            "at": {"type": "string", "format": "date-time"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
    }  # fmt: skip
    ctx = SerializationContext(topic, MessageField.VALUE)
    with SchemaRegistryClient({"url": env.registry}) as client:
        ser = JSONSerializer(json.dumps(schema), client)
        values = [
            ser({"name": "x", "n": 1, "at": "2026-01-02T03:04:05Z", "tags": ["a"]}, ctx),
            ser({"name": "y"}, ctx),
        ]
    _produce(env, topic, values)
    s = _run(spark, env.cfg((topic,), value_format="json-schema"))
    assert (s.rows, s.dead_letters) == (2, 0)
    rows = env.rows(topic.replace("-", "_"))
    assert [(r["name"], r["n"], r["at"], r["tags"]) for r in rows] == [
        ("x", 1, datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), ["a"]),
        ("y", None, None, None),
    ]


def test_evolution_promotes_and_stops_on_incompatible(env: Env, spark: SparkSession) -> None:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from ingest_job.model import IngestError

    topic = f"evolve-{uuid.uuid4().hex[:6]}"
    create_topic(env.broker.bootstrap, topic, 1)
    ctx = SerializationContext(topic, MessageField.VALUE)
    a = {"type": "record", "name": "E", "fields": [{"name": "a", "type": "int"}]}
    b = {
        "type": "record",
        "name": "E",
        "fields": [
            {"name": "a", "type": "long"},
            {"name": "b", "type": ["null", "string"], "default": None},
        ],
    }
    c = {"type": "record", "name": "E", "fields": [{"name": "a", "type": "string"}]}  # fmt: skip
    with SchemaRegistryClient({"url": env.registry}) as client:
        conf = {"auto.register.schemas": True}
        vals = [AvroSerializer(client, json.dumps(a), conf=conf)({"a": 1}, ctx)]
        vals.append(AvroSerializer(client, json.dumps(b), conf=conf)({"a": 2**40, "b": "x"}, ctx))
        _produce(env, topic, vals)
        s = _run(spark, env.cfg((topic,), value_format="avro"))
        assert s.rows == 2
        table = topic.replace("-", "_")
        assert [(r["a"], r["b"]) for r in env.rows(table)] == [(1, None), (2**40, "x")]
        catalog = cat.open_catalog(None, str(env.data))
        assert str(catalog.load_table(("kafscale", table)).schema().find_field("a").field_type) == (
            "long"
        )
        client.set_compatibility(f"{topic}-value", "NONE")
        client.register_schema(f"{topic}-value", Schema(json.dumps(c), "AVRO"))
    _produce(env, topic, [vals[0]])
    with pytest.raises(IngestError, match=r"version 3 .* is incompatible with the table"):
        _run(spark, env.cfg((topic,), value_format="avro"))
    assert len(env.rows(table)) == 2  # nothing committed


ENVELOPE = {
    "type": "record", "name": "Envelope", "namespace": "dbserver.shop.items",
    "fields": [
        {"name": "before", "type": ["null", {"type": "record", "name": "Value", "fields": [
            {"name": "id", "type": "int"}, {"name": "name", "type": "string"},
            {"name": "price", "type": {"type": "bytes", "logicalType": "decimal",
                                       "precision": 8, "scale": 2}}]}], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
    ],
}  # fmt: skip
ITEM_KEY = {"type": "record", "name": "Key", "namespace": "dbserver.shop.items",
            "fields": [{"name": "id", "type": "int"}]}  # fmt: skip


def test_avro_debezium_upserts_with_avro_keys(env: Env, spark: SparkSession) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = f"items-{uuid.uuid4().hex[:6]}"
    create_topic(env.broker.bootstrap, topic, 2)
    vctx = SerializationContext(topic, MessageField.VALUE)
    kctx = SerializationContext(topic, MessageField.KEY)

    def row(i: int, name: str) -> dict[str, Any]:
        return {"id": i, "name": name, "price": Decimal(f"{i}.99")}

    events = [
        (1, {"op": "r", "before": None, "after": row(1, "a")}),
        (2, {"op": "c", "before": None, "after": row(2, "b")}),
        (3, {"op": "c", "before": None, "after": row(3, "c")}),
        (1, {"op": "u", "before": row(1, "a"), "after": row(1, "a2")}),
        (2, {"op": "d", "before": row(2, "b"), "after": None}),
        (2, None),  # tombstone
        (4, {"op": "c", "before": None, "after": row(4, "d")}),
        (3, {"op": "d", "before": row(3, "c"), "after": None}),
        (3, {"op": "c", "before": None, "after": row(3, "c2")}),
    ]
    with SchemaRegistryClient({"url": env.registry}) as client:
        vser = AvroSerializer(client, json.dumps(ENVELOPE))
        kser = AvroSerializer(client, json.dumps(ITEM_KEY))
        p = Producer({"bootstrap.servers": env.broker.bootstrap, "acks": "all"})
        for half in (events[:5], events[5:]):
            for key, ev in half:
                p.produce(topic, key=kser({"id": key}, kctx),
                          value=None if ev is None else vser(ev, vctx),
                          partition=key % 2)  # fmt: skip
            assert p.flush(30) == 0
            cfg = env.cfg((topic,), value_format="avro", key_format="avro", cdc="debezium",
                          upsert_key=("id",))  # fmt: skip
            s = _run(spark, cfg)
            assert s.dead_letters == 0
    rows = env.rows(topic.replace("-", "_"))
    got = sorted((r["id"], r["key_id"], r["name"], r["price"]) for r in rows)
    assert got == [(1, 1, "a2", Decimal("1.99")), (3, 3, "c2", Decimal("3.99")),
                   (4, 4, "d", Decimal("4.99"))]  # fmt: skip
