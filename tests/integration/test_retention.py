"""Log maintenance against real broker processes and real clients: small segments are
merged (and stay readable at their offsets), replaced objects are deleted after the grace
period, retention by bytes and by time moves the log start, DeleteRecords through
confluent-kafka's and kafka-python's admin clients.

The manifest is read from the real metadata store (a read-only embedded store: a
snapshot at open, so it is reopened for every look; or etcd), the objects from the real
object store (the local directory, or SeaweedFS S3).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from broker.meta.base import open_meta
from segments.format import partition_prefix
from segments.store import open_store
from tests.fixtures.broker import BrokerProcess, start_broker
from tests.fixtures.etcd import etcd_url  # noqa: F401 - fixture
from tests.fixtures.s3 import seaweedfs_s3  # noqa: F401 - fixture
from tests.integration import kafka_raw as kr
from tests.integration.conftest import backend_kwargs

pytestmark = pytest.mark.integration

TIMEOUT = 30.0
OFFSET_OUT_OF_RANGE = 1
T = TypeVar("T")


class Backend:
    """Where a broker keeps its manifest and objects, for reading them from the test."""

    def __init__(self, workdir: Path, kwargs: dict[str, Any]) -> None:
        self.workdir = workdir
        self.kwargs = kwargs
        self.meta_url = kwargs.get("meta_url") or "embedded"
        self.store_url = kwargs.get("store_url") or f"file://{workdir}/data"
        extra = kwargs.get("extra_args", ())
        self.prefix = extra[extra.index("--meta-prefix") + 1] if extra else "/kafscale"

    def start(self, *args: str) -> BrokerProcess:
        kw = dict(self.kwargs)
        kw["extra_args"] = (*kw.get("extra_args", ()), *args)
        return start_broker(self.workdir, **kw)

    def manifest(self, topic: str) -> list[dict[str, Any]]:
        async def read() -> list[dict[str, Any]]:
            meta = open_meta(self.meta_url, str(self.workdir / "data"), self.prefix, read_only=True)
            try:
                return [
                    json.loads(kv.value) for kv in await meta.range(f"/logs/{topic}/0/segments/")
                ]
            finally:
                await meta.close()

        return asyncio.run(read())

    def objects(self, topic: str) -> set[str]:
        async def read() -> set[str]:
            store = open_store(self.store_url)
            prefix = partition_prefix("default", topic, 0)
            try:
                return {o.key[len(prefix) :] for o in await store.list(prefix)}
            finally:
                await store.close()

        return asyncio.run(read())


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = TIMEOUT) -> T:
    """Poll an outside process's state (its manifest, a watermark) until ``probe`` holds."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def produce_one_by_one(bootstrap: str, topic: str, n: int, ts: int = 0) -> None:
    """``n`` messages, each acknowledged before the next: one batch, one segment each."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
    errors: list[Any] = []
    for i in range(n):
        kw: dict[str, Any] = {"timestamp": ts} if ts else {}
        p.produce(topic, value=f"message-{i:04d}".encode() * 8, key=str(i).encode(), **kw)
        p.poll(0)
        assert p.flush(TIMEOUT) == 0
    p.flush(TIMEOUT)
    assert not errors


def consume_all(bootstrap: str, topic: str, expect: int) -> list[tuple[int, bytes]]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    out: list[tuple[int, bytes]] = []
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + TIMEOUT
        while len(out) < expect and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                out.append((int(m.offset() or 0), bytes(m.value() or b"")))
    finally:
        c.close()
    return out


def watermarks(bootstrap: str, topic: str) -> tuple[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "wm"})
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT)
        return int(low), int(high)
    finally:
        c.close()


def create_topic(bootstrap: str, topic: str, configs: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, 1, 1, config=configs or {})])
    futures[topic].result(TIMEOUT)


def value(i: int) -> bytes:
    return f"message-{i:04d}".encode() * 8


@pytest.mark.parametrize("backend", ["local", "s3-etcd"])
def test_small_segments_merge_and_stay_readable(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    be = Backend(tmp_path / "broker", backend_kwargs(request, backend))
    # 4 MiB small: merged segments stay below the size-tiering floor (64 KiB), so the
    # ~20 KB of the 120 segments end as ONE (tiering: tests/unit/broker/test_maintenance_*)
    b = be.start(
        "--merge-interval-ms", "100", "--merge-min-age-ms", "300",
        "--merge-min-segments", "2", "--segment-delete-grace-ms", "1500",
        "--merge-small-bytes", "4194304",
    )  # fmt: skip
    try:
        topic = "merge-me"
        create_topic(b.bootstrap, topic)
        n = 120
        produce_one_by_one(b.bootstrap, topic, n)
        entries = wait_for(
            "one merged manifest entry",
            lambda: (e := be.manifest(topic)) and len(e) == 1 and e[0].get("key") and e,
        )
        assert entries[0]["base"] == 0 and entries[0]["last"] == n - 1
        assert entries[0]["records"] == n
        assert consume_all(b.bootstrap, topic, n) == [(i, value(i)) for i in range(n)]
        fetched = kr.fetch_records(b.port, topic, 0, 77)  # an offset inside the merged one
        assert fetched.error_code == 0 and fetched.records[0][0] == 77
        merged = str(entries[0]["key"])
        wait_for(
            "the replaced objects to be deleted",
            lambda: be.objects(topic) == {merged},  # one object: its index inside
        )
        # a restarted broker (new owner) reads the merged manifest
        b.restart()
        assert consume_all(b.bootstrap, topic, n) == [(i, value(i)) for i in range(n)]
    finally:
        b.stop()
    assert "Traceback" not in b.log_text()


def test_retention_by_bytes_moves_the_log_start(tmp_path: Path) -> None:
    be = Backend(tmp_path / "broker", {})
    b = be.start("--merge-interval-ms", "0", "--retention-check-interval-ms", "100")
    try:
        topic = "by-bytes"
        create_topic(b.bootstrap, topic, {"retention.bytes": "2000"})
        produce_one_by_one(b.bootstrap, topic, 30)
        wait_for("the log start to move", lambda: watermarks(b.bootstrap, topic)[0])

        def settled() -> tuple[int, int] | None:
            w = watermarks(b.bootstrap, topic)
            size = sum(int(e["bytes"]) for e in be.manifest(topic))
            return w if size <= 2000 + 400 else None

        low, high = wait_for("retention to settle", settled)
        assert 0 < low < high == 30
        entries = be.manifest(topic)
        assert entries[0]["base"] == low and entries[-1]["last"] == 29
        total = sum(int(e["bytes"]) for e in entries)
        assert total - int(entries[0]["bytes"]) < 2000 <= total
        got = consume_all(b.bootstrap, topic, 30 - low)
        assert got == [(i, value(i)) for i in range(low, 30)]
        below = kr.fetch_records(b.port, topic, 0, 0)
        assert below.error_code == OFFSET_OUT_OF_RANGE
    finally:
        b.stop()


def test_retention_by_time_keeps_only_the_last_segment(tmp_path: Path) -> None:
    be = Backend(tmp_path / "broker", {})
    b = be.start("--merge-interval-ms", "0", "--retention-check-interval-ms", "100")
    try:
        topic = "by-time"
        create_topic(b.bootstrap, topic, {"retention.ms": "4000"})
        hour_ago = int(time.time() * 1000) - 3_600_000
        produce_one_by_one(b.bootstrap, topic, 5, ts=hour_ago)
        # retention counts from the later of the records' timestamps and the write time:
        # records produced with old timestamps are not dropped the moment they land
        assert watermarks(b.bootstrap, topic) == (0, 5)
        wait_for("old segments to go", lambda: watermarks(b.bootstrap, topic) == (4, 5))
        assert [e["base"] for e in be.manifest(topic)] == [4]
        assert consume_all(b.bootstrap, topic, 1) == [(4, value(4))]
        produce_one_by_one(b.bootstrap, topic, 1)  # fresh data is kept
        low, high = watermarks(b.bootstrap, topic)
        assert high == 6 and low in (4, 5)  # the last segment always stays
    finally:
        b.stop()


def test_delete_records_with_confluent_and_kafka_python(tmp_path: Path) -> None:
    be = Backend(tmp_path / "broker", {})
    b = be.start("--merge-interval-ms", "0", "--segment-delete-grace-ms", "200")
    try:
        topic = "delete-me"
        create_topic(b.bootstrap, topic)
        produce_one_by_one(b.bootstrap, topic, 10)
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        fut = admin.delete_records([TopicPartition(topic, 0, 3)])[TopicPartition(topic, 0, 3)]
        assert fut.result(TIMEOUT).low_watermark == 3
        assert watermarks(b.bootstrap, topic) == (3, 10)
        assert kr.fetch_records(b.port, topic, 0, 2).error_code == OFFSET_OUT_OF_RANGE
        assert consume_all(b.bootstrap, topic, 7) == [(i, value(i)) for i in range(3, 10)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from kafka import TopicPartition as KTP
            from kafka.admin import KafkaAdminClient
        kadmin = KafkaAdminClient(bootstrap_servers=b.bootstrap, request_timeout_ms=15000)
        try:
            res = kadmin.delete_records({KTP(topic, 0): 7})
            assert res[KTP(topic, 0)]["low_watermark"] == 7
            assert res[KTP(topic, 0)]["error_code"] == 0
            res = kadmin.delete_records({KTP(topic, 0): -1})  # -1: the high watermark
            assert res[KTP(topic, 0)]["low_watermark"] == 10
        finally:
            kadmin.close()
        assert watermarks(b.bootstrap, topic) == (10, 10)
        assert be.manifest(topic) == []
        wait_for("the deleted segments' objects to go", lambda: be.objects(topic) == set())
        produce_one_by_one(b.bootstrap, topic, 1)
        assert consume_all(b.bootstrap, topic, 1) == [(10, value(0))]
        b.restart()  # the log start survives a new owner
        assert watermarks(b.bootstrap, topic) == (10, 11)
    finally:
        b.stop()
