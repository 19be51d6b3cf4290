"""Log compaction against real broker processes and real clients, on the local store with
embedded metadata and on SeaweedFS S3 with etcd: an idempotent confluent-kafka producer
writes keyed updates (many versions, some tombstones) across compaction passes; a
consumer from the beginning then sees exactly one record per live key at its original
offset with its last value; tombstones stay until ``delete.retention.ms`` and then go;
a record without a key is refused.

The manifest is read from the real metadata store (``Backend`` of test_retention.py).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from protocol.records import build_batch
from tests.fixtures.broker import BrokerProcess, start_broker
from tests.fixtures.etcd import etcd_url  # noqa: F401 - fixture
from tests.fixtures.s3 import seaweedfs_s3  # noqa: F401 - fixture
from tests.integration import kafka_raw as kr
from tests.integration.conftest import BACKENDS, backend_kwargs
from tests.integration.test_retention import Backend, create_topic, wait_for, watermarks

pytestmark = pytest.mark.integration

TIMEOUT = 60.0
CORRUPT_MESSAGE, INVALID_RECORD = 2, 87
KEYS = 10_000  # as the issue asks: 10k keys, many versions, some tombstones
ROUNDS = 5
FAST = ("--merge-interval-ms", "200", "--segment-delete-grace-ms", "500")
Row = tuple[int, bytes | None, bytes | None]


def read_partition(bootstrap: str, topic: str) -> list[Row]:
    """Every record of partition 0 from the beginning up to the high watermark."""
    _low, high = watermarks(bootstrap, topic)
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"r-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    out: list[Row] = []
    try:
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline and high > 0:
            m = c.poll(0.5)
            if m is None:
                continue
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF and out and out[-1][0] >= high - 1:
                    break
                continue
            out.append((int(m.offset() or 0), m.key(), m.value()))
            if out[-1][0] >= high - 1:
                break
    finally:
        c.close()
    return out


def set_policy(bootstrap: str, topic: str, policy: str) -> None:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry("cleanup.policy", policy, incremental_operation=AlterConfigOpType.SET)
    res = ConfigResource("topic", topic, incremental_configs=[entry])
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result(timeout=TIMEOUT)


def wait(broker: BrokerProcess, what: str, probe: Callable[[], bool]) -> None:
    """``wait_for`` with the broker's warnings in the message when it times out."""
    try:
        wait_for(what, probe, TIMEOUT)
    except AssertionError as exc:
        warnings = [ln for ln in broker.log_text().splitlines() if "WARNING" in ln or "ERROR" in ln]
        raise AssertionError(f"{exc}; broker warnings: {warnings[-20:]}") from None


def _first_batch(be: Backend, topic: str) -> Any:
    import asyncio

    from segments.format import iter_segment_batches, partition_prefix
    from segments.store import open_store

    entry = be.manifest(topic)[0]

    async def read() -> bytes:
        store = open_store(be.store_url)
        try:
            return bytes(await store.get(partition_prefix("default", topic, 0) + entry["key"]))
        finally:
            await store.close()

    data = asyncio.run(read())
    return next(hdr for _pos, hdr, _view in iter_segment_batches(data))


class Deliveries:
    """Delivery reports: the offset of every acknowledged record, and every error."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.errors: list[Any] = []

    def __call__(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(err)
        else:
            self.rows.append((int(msg.offset()), msg.key(), msg.value()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_keyed_updates_compact_to_the_last_value_per_key(
    request: pytest.FixtureRequest, tmp_path: Any, backend: str
) -> None:
    be = Backend(tmp_path, backend_kwargs(request, backend))
    broker = be.start(*FAST)
    topic = f"cmp-{uuid.uuid4().hex[:8]}"
    try:
        create_topic(
            broker.bootstrap,
            topic,
            {
                "cleanup.policy": "compact",
                "min.cleanable.dirty.ratio": "0.01",
                "delete.retention.ms": "3000",
            },
        )
        dr = Deliveries()
        p = Producer(
            {"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 5}
        )
        for r in range(ROUNDS):
            for k in range(KEYS):
                dead = r == ROUNDS - 1 and k % 10 == 0
                p.produce(topic, key=b"k%d" % k, value=None if dead else b"v%d-%d" % (r, k),
                          on_delivery=dr)  # fmt: skip
                p.poll(0)
            assert p.flush(TIMEOUT) == 0
            if 0 < r < ROUNDS - 1:  # the same idempotent producer goes on across passes
                produced = len(dr.rows)
                wait(
                    broker,
                    f"a compaction pass after round {r}",
                    lambda n=produced: sum(e["records"] for e in be.manifest(topic)) < n,  # type: ignore[misc]
                )
        p.produce(topic, key=b"marker", value=b"end", on_delivery=dr)
        assert p.flush(TIMEOUT) == 0
        assert dr.errors == []  # no OUT_OF_ORDER_SEQUENCE_NUMBER, nothing failed
        offsets = [o for o, _k, _v in dr.rows]
        assert len(set(offsets)) == len(offsets) == ROUNDS * KEYS + 1  # no duplicates

        last: dict[bytes | None, Row] = {}
        for row in dr.rows:
            last[row[1]] = row
        want = sorted(last.values())
        wait(broker, "one record per key", lambda: read_partition(broker.bootstrap, topic) == want)
        # every compacted entry is a compacted segment named by the manifest
        assert any(e.get("cleaned") for e in be.manifest(topic))
        live = [row for row in want if row[2] is not None]
        assert len(live) == KEYS - KEYS // 10 + 1
        wait(
            broker,
            "tombstones gone after delete.retention.ms",
            lambda: read_partition(broker.bootstrap, topic) == live,
        )

        # a record without a key is refused (INVALID_RECORD since Produce v8)
        bad = Deliveries()
        plain = Producer({"bootstrap.servers": broker.bootstrap, "retries": 0})
        plain.produce(topic, value=b"no key", on_delivery=bad)
        plain.flush(TIMEOUT)
        assert [e.code() for e in bad.errors] == [KafkaError.INVALID_RECORD]
        keyless = build_batch([(b"k", b"v", None), (None, b"v", None)])
        old = kr.produce_raw(broker.port, topic, 0, keyless, version=7)
        assert old.error_code == CORRUPT_MESSAGE  # INVALID_RECORD came with Produce v8
        new = kr.produce_raw(broker.port, topic, 0, keyless, version=8)
        assert new.error_code == INVALID_RECORD and "without key" in (new.error_message or "")
        assert read_partition(broker.bootstrap, topic) == live
        # a Fetch at an offset compaction removed returns the next batch
        removed = dr.rows[0][0]
        fetched = kr.fetch_records(broker.port, topic, 0, removed)
        assert fetched.error_code == 0 and fetched.records[0][0] == live[0][0] > removed
    finally:
        broker.stop()


@pytest.mark.parametrize("backend", BACKENDS)
def test_kill9_mid_pass_loses_nothing_and_the_next_owner_resumes(
    request: pytest.FixtureRequest, tmp_path: Any, backend: str
) -> None:
    """The owner is frozen at ``compaction.before_commit`` (its outputs uploaded, the swap
    not committed) and killed; a new broker on the same store and metadata takes over:
    every acknowledged record is still there exactly once, then it compacts."""
    from tests.integration.zombie_cluster import stopped

    be = Backend(tmp_path, backend_kwargs(request, backend))
    frozen = start_broker(
        tmp_path,
        **{**be.kwargs, "extra_args": (*be.kwargs.get("extra_args", ()), *FAST)},
        env={"KAFSCALE_FAULT_PAUSE": "compaction.before_commit"},
    )
    topic = f"cmp-kill-{uuid.uuid4().hex[:8]}"
    try:
        create_topic(frozen.bootstrap, topic, {"cleanup.policy": "delete"})
        dr = Deliveries()
        p = Producer({"bootstrap.servers": frozen.bootstrap, "acks": "all", "linger.ms": 5})
        for r in range(3):
            for k in range(200):
                p.produce(topic, key=b"k%d" % k, value=b"v%d-%d" % (r, k), on_delivery=dr)
            assert p.flush(TIMEOUT) == 0
        assert dr.errors == [] and len(dr.rows) == 600
        set_policy(frozen.bootstrap, topic, "compact")  # takes effect on the live topic
        wait_for("the owner frozen mid-pass", lambda: stopped(frozen.pid), TIMEOUT)
        assert "fault checkpoint compaction.before_commit" in frozen.log_text()
        before = be.manifest(topic)
        assert not any(e.get("cleaned") for e in before)  # nothing swapped in yet
    finally:
        frozen.kill9()
    nxt = be.start(*FAST)
    try:
        last: dict[bytes | None, Row] = {}
        for row in dr.rows:
            last[row[1]] = row
        want = sorted(last.values())
        # whether or not the new owner compacted yet: offsets unique and ascending, only
        # acknowledged records, and the last one of every key is there
        rows = read_partition(nxt.bootstrap, topic)
        offsets = [o for o, _k, _v in rows]
        assert offsets == sorted(set(offsets))
        assert set(rows) <= set(dr.rows) and set(want) <= set(rows)
        wait(nxt, "the next owner compacts", lambda: read_partition(nxt.bootstrap, topic) == want)
        assert any(e.get("cleaned") for e in be.manifest(topic))
        # every manifest entry names an object that exists
        names = be.objects(topic)
        assert all(e["key"] in names for e in be.manifest(topic))
    finally:
        nxt.stop()


def test_consumers_read_past_a_producers_empty_last_batch(tmp_path: Any) -> None:
    """An idempotent producer's last batch, all of it superseded, stays as an empty batch
    header (its sequence state survives); confluent-kafka and kafka-python consumers read
    past it to the end without a stall."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition

    be = Backend(tmp_path, {})
    broker = be.start(*FAST)
    topic = f"cmp-empty-{uuid.uuid4().hex[:8]}"
    try:
        create_topic(broker.bootstrap, topic, {"cleanup.policy": "compact"})
        idem = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
        idem.produce(topic, key=b"a", value=b"1")
        assert idem.flush(TIMEOUT) == 0
        plain = Producer({"bootstrap.servers": broker.bootstrap})
        plain.produce(topic, key=b"a", value=b"2")
        plain.produce(topic, key=b"end", value=b"x")
        assert plain.flush(TIMEOUT) == 0
        want: list[Row] = [(1, b"a", b"2"), (2, b"end", b"x")]
        wait(broker, "confluent reads", lambda: read_partition(broker.bootstrap, topic) == want)
        hdr = _first_batch(be, topic)  # the producer's last batch, emptied
        assert (hdr.base_offset, hdr.record_count, hdr.last_offset) == (0, 0, 0)
        assert hdr.producer_id >= 0 and hdr.base_sequence == 0
        c = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False)
        try:
            c.assign([KTopicPartition(topic, 0)])
            c.seek_to_beginning()
            got: list[Row] = []
            deadline = time.monotonic() + TIMEOUT
            while len(got) < 2 and time.monotonic() < deadline:
                for recs in c.poll(timeout_ms=500).values():
                    got += [(r.offset, r.key, r.value) for r in recs]
            assert got == want
        finally:
            c.close()
    finally:
        broker.stop()
