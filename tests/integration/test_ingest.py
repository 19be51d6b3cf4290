"""The ingest job end to end on Spark local[2]: real segments, real catalog, read back.

Segments are written through the real object store with manifest entries in the real
embedded metadata store; the tables are read back with pyiceberg and DuckDB and compared
record for record with what was written.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from broker.meta.base import open_meta
from ingest_job import catalog as cat
from ingest_job.job import IngestConfig, IngestSummary, run_ingest
from ingest_job.model import IngestError
from protocol.compression import Compression
from segments.store import open_store
from tests.fixtures.broker import BrokerProcess
from tests.fixtures.s3 import S3Endpoint, create_bucket
from tests.unit.ingest_job.conftest import KafsEnv
from tests.unit.ingest_job.segdata import Rec, rows_of, values_for

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    from ingest_job.spark import get_spark

    session = get_spark("local[2]")
    yield session
    session.stop()


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[KafsEnv]:
    data = tmp_path / "data"
    data.mkdir()
    store_url = f"file://{data}/segments"
    store = open_store(store_url)
    meta = open_meta("embedded", data_dir=str(data))
    try:
        yield KafsEnv(data, store_url, store, meta)
    finally:
        await meta.close()
        await store.close()


def _cfg(env: KafsEnv, topics: tuple[str, ...], **kw: object) -> IngestConfig:
    return IngestConfig(
        topics=topics,
        store_url=env.store_url,
        data_dir=str(env.data_dir),
        master="local[2]",
        progress_interval=1.0,
        **kw,  # type: ignore[arg-type]
    )


async def _ingest(spark: SparkSession, cfg: IngestConfig) -> IngestSummary:
    lines: list[str] = []
    summary = await asyncio.to_thread(run_ingest, cfg, spark, lines.append)
    assert any(line.startswith(f"ingest {summary.run_id}:") for line in lines)
    return summary


def _table_rows(env: KafsEnv, table: str) -> list[Rec]:
    catalog = cat.open_catalog(None, str(env.data_dir))
    return rows_of(catalog.load_table(("kafscale", table)).scan().to_arrow().to_pylist())


def _duckdb_rows(env: KafsEnv, table: str) -> list[Rec]:
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    catalog = cat.open_catalog(None, str(env.data_dir))
    location = catalog.load_table(("kafscale", table)).metadata_location
    con = duckdb.connect()
    for mod, name in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")):
        base = Path(mod.__file__).parent / "extensions"
        (path,) = base.glob(f"*/{name}.duckdb_extension")
        con.execute(f"LOAD '{path}'")
    got = con.execute(
        'SELECT topic, partition, "offset", epoch_us(timestamp), key, value, headers '
        f"FROM iceberg_scan('{location.removeprefix('file://')}')"
    ).fetchall()
    cols = ["topic", "partition", "offset", "timestamp", "key", "value", "headers"]
    return rows_of([dict(zip(cols, row, strict=True)) for row in got])


def _sorted(recs: list[Rec]) -> list[Rec]:
    return sorted(recs, key=lambda r: (r.topic, r.partition, r.offset))


async def test_every_codec_read_back_record_for_record(spark: SparkSession, env: KafsEnv) -> None:
    orders = await env.topic("orders", 2)
    payments = await env.topic("payments.eu", 1)
    want: list[Rec] = []
    for w in orders:
        for codec in Compression:
            want += await w.append(values_for("orders", w.partition, w.next_offset, 60), codec)
    want_pay = await payments[0].append(values_for("p", 0, 0, 40), Compression.SNAPPY)
    cfg = _cfg(env, ("orders", "payments.eu"))
    s1 = await _ingest(spark, cfg)
    assert s1.records == len(want) + len(want_pay) and s1.rows == s1.records
    assert s1.offsets["kafscale.orders"] == {("orders", 0): 300, ("orders", 1): 300}
    assert _table_rows(env, "orders") == _sorted(want)
    assert _table_rows(env, "payments_eu") == _sorted(want_pay)
    assert _duckdb_rows(env, "orders") == _sorted(want)
    # a second run finds nothing new; a third picks up exactly the new records
    s2 = await _ingest(spark, cfg)
    assert s2.records == 0 and s2.rows == 0
    more = await orders[1].append(values_for("orders", 1, 300, 25), Compression.GZIP)
    s3 = await _ingest(spark, cfg)
    assert s3.rows == 25 and s3.offsets["kafscale.orders"][("orders", 1)] == 325
    assert _table_rows(env, "orders") == _sorted(want + more)
    assert _duckdb_rows(env, "orders") == _sorted(want + more)


async def test_json_schema_evolution_and_dead_letters(spark: SparkSession, env: KafsEnv) -> None:
    (w,) = await env.topic("events")
    await w.append([b'{"user": "a", "n": 1}', b'{"user": "b", "n": 2}', None])
    cfg = _cfg(env, ("events",), value_format="json", partition_by="hour")
    await _ingest(spark, cfg)
    await w.append([b'{"user": "c", "n": 3, "extra": {"x": 1}}', b"{oops", b'{"n": "three"}'])
    s = await _ingest(spark, cfg)
    assert s.dead_letters == 2
    catalog = cat.open_catalog(None, str(env.data_dir))
    tbl = catalog.load_table(("kafscale", "events"))
    assert cat.json_fields(tbl) == {"extra": "string", "n": "long", "user": "string"}
    rows = sorted(tbl.scan().to_arrow().select(["offset", "user", "n", "extra"]).to_pylist(),
                  key=lambda r: r["offset"])  # fmt: skip
    assert rows == [
        {"offset": 0, "user": "a", "n": 1, "extra": None},
        {"offset": 1, "user": "b", "n": 2, "extra": None},
        {"offset": 2, "user": None, "n": None, "extra": None},
        {"offset": 3, "user": "c", "n": 3, "extra": '{"x":1}'},
    ]
    dead = catalog.load_table(("kafscale", "events_dead_letters")).scan().to_arrow().to_pylist()
    dead.sort(key=lambda r: r["offset"])
    assert [(r["offset"], r["value"]) for r in dead] == [(4, b"{oops"), (5, b'{"n": "three"}')]
    assert "invalid JSON" in dead[0]["error"] and "type conflict" in dead[1]["error"]


async def test_json_lone_surrogate_is_one_dead_letter(spark: SparkSession, env: KafsEnv) -> None:
    """A JSON string with an unpaired surrogate escape (valid JSON, but no UTF-8 text) in
    a value or a key goes to the dead-letter table; the rest of the unit is committed."""
    (w,) = await env.topic("sur")
    await w.append(
        [
            b'{"user": "a", "n": 1}',
            b'{"user": "x\\ud800y", "n": 2}',
            b'{"\\udc00": 1, "n": 3}',
            b'{"user": "\\ud83d\\ude00", "n": 4, "deep": {"s": "\\ud800"}}',
            b'{"user": "b\xed\xa0\x80", "n": 5}',
            b'{"user": "c", "n": 6}',
        ]
    )
    cfg = _cfg(env, ("sur",), value_format="json", partition_by="none")
    s = await _ingest(spark, cfg)
    assert (s.rows, s.dead_letters) == (3 + 3, 3)  # 3 rows + 3 dead letters committed
    catalog = cat.open_catalog(None, str(env.data_dir))
    rows = (
        catalog.load_table(("kafscale", "sur"))
        .scan()
        .to_arrow()
        .select(["offset", "user", "n", "deep"])
    )
    got = sorted(rows.to_pylist(), key=lambda r: r["offset"])
    assert got == [
        {"offset": 0, "user": "a", "n": 1, "deep": None},
        {"offset": 3, "user": "\U0001f600", "n": 4, "deep": '{"s":"\\ud800"}'},
        {"offset": 5, "user": "c", "n": 6, "deep": None},
    ]
    dead = catalog.load_table(("kafscale", "sur_dead_letters")).scan().to_arrow().to_pylist()
    dead.sort(key=lambda r: r["offset"])
    assert [r["offset"] for r in dead] == [1, 2, 4]
    assert all("invalid JSON" in r["error"] and "surrogate" in r["error"] for r in dead)
    assert cat.table_offsets(catalog.load_table(("kafscale", "sur"))) == {("sur", 0): 6}


async def test_one_table_capped_runs_add_up_exactly_once(spark: SparkSession, env: KafsEnv) -> None:
    a = await env.topic("a", 2)
    b = await env.topic("b", 1)
    want: list[Rec] = []
    for w in [*a, *b]:
        want += await w.append(values_for(w.topic, w.partition, 0, 30), hour_step_ms=1_800_000)
        want += await w.append(values_for(w.topic, w.partition, 30, 10))
    cfg = _cfg(env, ("a", "b"), table="all_events", max_records=50, partition_by="hour")
    runs = []
    for _ in range(4):
        runs.append(await _ingest(spark, cfg))
    assert [r.records for r in runs] == [50, 50, 20, 0]
    assert _table_rows(env, "all_events") == _sorted(want)


async def test_corrupt_segment_commits_nothing_then_gap_lets_it_continue(
    spark: SparkSession, env: KafsEnv
) -> None:
    (w,) = await env.topic("c")
    good = await w.append(values_for("c", 0, 0, 20))

    def flip(data: bytearray) -> bytes:
        data[200] ^= 0xFF
        return bytes(data)

    await w.append(values_for("c", 0, 20, 20), mangle=flip)
    after = await w.append(values_for("c", 0, 40, 20))
    cfg = _cfg(env, ("c",), unit_bytes=1)  # one task per segment
    with pytest.raises(
        IngestError, match=r"default/c/0/segment-0+20\.kfs \(c/0 offsets 20\.\.39\)"
    ):
        await _ingest(spark, cfg)
    catalog = cat.open_catalog(None, str(env.data_dir))
    tbl = catalog.load_table(("kafscale", "c"))
    assert tbl.current_snapshot() is None
    data_dir = Path(tbl.location().removeprefix("file://")) / "data"
    assert not [p for p in data_dir.rglob("*.parquet")]  # the good tasks' files were removed
    # the operator drops the bad segment from the manifest: the next run reports the gap
    await env.meta.delete("/logs/c/0/segments/00000000000000000020")
    s = await _ingest(spark, cfg)
    assert [str(g) for g in s.gaps] == ["c/0 offsets 20..39"]
    assert _table_rows(env, "c") == good + after


async def test_missing_object_is_named(spark: SparkSession, env: KafsEnv) -> None:
    (w,) = await env.topic("m")
    await w.append(values_for("m", 0, 0, 5))
    await env.store.delete("default/m/0/segment-00000000000000000000.kfs")
    with pytest.raises(IngestError, match="segment-0+\\.kfs .*named by the manifest is missing"):
        await _ingest(spark, _cfg(env, ("m",)))


async def test_kafs_data_source(spark: SparkSession, env: KafsEnv) -> None:
    from ingest_job.source import register

    ws = await env.topic("ds", 2)
    want: list[Rec] = []
    for w in ws:
        want += await w.append(values_for("ds", w.partition, 0, 33), Compression.LZ4)
    register(spark)
    df = (
        spark.read.format("kafs")
        .option("topics", "ds")
        .option("store", env.store_url)
        .option("dataDir", str(env.data_dir))
        .option("startingOffsets", '{"ds": {"1": 30}}')
        .load()
    )
    assert df.schema.simpleString().startswith("struct<topic:string,partition:int,offset:bigint")
    rows = [r.asDict(recursive=True) for r in df.collect()]
    expect = [r for r in want if r.partition == 0 or r.offset >= 30]
    got = rows_of(rows)
    assert [(r.partition, r.offset, r.key, r.value, r.headers) for r in got] == [
        (r.partition, r.offset, r.key, r.value, r.headers) for r in _sorted(expect)
    ]
    assert os.environ["PYSPARK_PYTHON"]


async def test_s3_segments_etcd_manifest_s3_warehouse(
    spark: SparkSession,
    tmp_path: Path,
    seaweedfs_s3: S3Endpoint,
    etcd_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SeaweedFS holds the segments and the Iceberg warehouse; etcd holds the manifest."""
    bucket = create_bucket(seaweedfs_s3)
    store_url = seaweedfs_s3.store_url(bucket, "kafs")
    prefix = f"/it-{uuid.uuid4().hex[:8]}"
    store = open_store(store_url)
    meta = open_meta(etcd_url, prefix=prefix)
    try:
        s3env = KafsEnv(tmp_path, store_url, store, meta)
        want: list[Rec] = []
        for w in await s3env.topic("s3t", 2):
            for codec in (Compression.ZSTD, Compression.SNAPPY):
                want += await w.append(values_for("s3t", w.partition, w.next_offset, 50), codec)
    finally:
        await meta.close()
        await store.close()
    for key, val in {
        "TYPE": "sql",
        "URI": f"sqlite:///{tmp_path}/s3cat.db",
        "WAREHOUSE": f"s3://{bucket}/warehouse",
        "S3__ENDPOINT": seaweedfs_s3.url,
        "S3__ACCESS_KEY_ID": seaweedfs_s3.access_key,
        "S3__SECRET_ACCESS_KEY": seaweedfs_s3.secret_key,
        "S3__REGION": seaweedfs_s3.region,
    }.items():
        monkeypatch.setenv(f"PYICEBERG_CATALOG__S3CAT__{key}", val)
    cfg = IngestConfig(
        topics=("s3t",), store_url=store_url, meta_url=etcd_url, meta_prefix=prefix,
        data_dir=str(tmp_path), catalog="s3cat", master="local[2]", value_format="json",
    )  # fmt: skip
    s = await _ingest(spark, cfg)
    assert s.rows == len(want)
    catalog = cat.open_catalog("s3cat")
    tbl = catalog.load_table(("kafscale", "s3t"))
    assert tbl.location().startswith(f"s3://{bucket}/warehouse")
    assert rows_of(tbl.scan().to_arrow().to_pylist()) == _sorted(want)
    assert (await _ingest(spark, cfg)).rows == 0


async def test_records_produced_through_the_broker_every_codec(
    spark: SparkSession, broker: BrokerProcess
) -> None:
    """confluent-kafka (librdkafka) produces with each codec; the table holds exactly that."""
    from confluent_kafka import Producer

    sent: list[tuple[bytes, bytes, tuple[tuple[str, bytes], ...]]] = []
    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        producer = Producer(
            {"bootstrap.servers": broker.bootstrap, "compression.type": codec, "linger.ms": 5}
        )
        for i in range(150):
            key = f"{codec}-{i}".encode()
            value = f'{{"codec": "{codec}", "i": {i}, "pad": "{"x" * (i % 50)}"}}'.encode()
            headers = (("codec", codec.encode()),) if i % 2 else ()
            producer.produce("bk", value=value, key=key, headers=list(headers))
            sent.append((key, value, headers))
        assert producer.flush(30) == 0
    data = broker.workdir / "data"
    cfg = IngestConfig(
        topics=("bk",), store_url=f"file://{data}", data_dir=str(data),
        master="local[2]", value_format="json", partition_by="none",
    )  # fmt: skip
    s = await _ingest(spark, cfg)
    assert s.rows == len(sent) and s.dead_letters == 0
    catalog = cat.open_catalog(None, str(data))
    rows = catalog.load_table(("kafscale", "bk")).scan().to_arrow().to_pylist()
    assert sorted(r["offset"] for r in rows) == list(range(len(sent)))
    got = sorted(
        (r["key"], r["value"], tuple((h["key"], h["value"]) for h in r["headers"])) for r in rows
    )
    assert got == sorted(sent)
    assert {r["codec"] for r in rows} == {"none", "gzip", "snappy", "lz4", "zstd"}


async def test_segments_inside_shared_objects(spark: SparkSession, tmp_path: Path) -> None:
    """A broker that writes each flush cycle's small segments as one shared object
    (docs/format.md, "Shared objects"): the ingest job reads their ranges, record for
    record. kafka-python sends both partitions in one request, so each cycle shares."""
    from kafka import KafkaProducer

    from tests.fixtures.broker import start_broker
    from tests.integration.conftest import create_topic

    args = ("--shared-objects-min-partitions", "2", "--flush-when-idle", "false",
            "--flush-interval-ms", "200", "--merge-interval-ms", "0")  # fmt: skip
    proc = start_broker(tmp_path, extra_args=args)
    try:
        create_topic(proc.bootstrap, "shr", 2)
        producer = KafkaProducer(bootstrap_servers=proc.bootstrap, acks="all", linger_ms=50)
        sent = []
        for rnd in range(3):
            for p in range(2):
                for i in range(20):
                    value = f'{{"r": {rnd}, "p": {p}, "i": {i}}}'.encode()
                    producer.send("shr", value=value, partition=p)
                    sent.append(value)
            producer.flush(60)
        producer.close()
        data = proc.workdir / "data"
        assert len(list((data / "default" / "@shared").iterdir())) == 3
        assert not [f for f in (data / "default" / "shr").rglob("*.kfs")]
        cfg = IngestConfig(
            topics=("shr",), store_url=f"file://{data}", data_dir=str(data),
            master="local[2]", value_format="json", partition_by="none",
        )  # fmt: skip
        s = await _ingest(spark, cfg)
    finally:
        proc.stop()
    assert s.rows == len(sent) and s.dead_letters == 0
    catalog = cat.open_catalog(None, str(data))
    rows = catalog.load_table(("kafscale", "shr")).scan().to_arrow().to_pylist()
    assert sorted(r["value"] for r in rows) == sorted(sent)
    assert sorted((r["partition"], r["offset"]) for r in rows) == [
        (p, o) for p in range(2) for o in range(60)
    ]


async def test_routing_by_field_value(spark: SparkSession, env: KafsEnv) -> None:
    (w,) = await env.topic("rt")
    first = [b'{"type": "click", "n": 1}', b'{"type": "View", "n": 2}', b'{"n": 3}', b"{bad"]
    await w.append(first)
    cfg = _cfg(env, ("rt",), value_format="json", route_by="type", partition_by="none")
    s1 = await _ingest(spark, cfg)
    assert s1.dead_letters == 1
    await w.append([b'{"type": "buy", "n": 5, "price": 9.5}', b'{"type": "click", "n": 6}'])
    await _ingest(spark, cfg)
    assert (await _ingest(spark, cfg)).rows == 0
    catalog = cat.open_catalog(None, str(env.data_dir))

    def offsets(table: str) -> list[int]:
        tbl = catalog.load_table(("kafscale", table))
        return sorted(tbl.scan().to_arrow().column("offset").to_pylist())

    assert offsets("rt_click") == [0, 5]
    assert offsets("rt_view") == [1]
    assert offsets("rt") == [2]  # no routing field: the base table
    assert offsets("rt_buy") == [4]
    assert offsets("rt_dead_letters") == [3]
    buy = catalog.load_table(("kafscale", "rt_buy"))
    assert cat.json_fields(buy) == {"n": "long", "price": "double", "type": "string"}
    assert cat.table_offsets(buy) == {("rt", 0): 6}
    assert cat.table_offsets(catalog.load_table(("kafscale", "rt_view"))) == {("rt", 0): 6}
