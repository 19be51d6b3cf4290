"""Shared objects (``--shared-objects-min-partitions``, docs/format.md "Shared objects"): a
flush cycle's segments of many partitions in ONE object, each partition's manifest entry
naming its byte range, and the shared sweep that deletes such an object only once no
entry names any segment in it and none can any more.

In-process brokers over a real local-directory store and the real embedded metadata
store, and over SeaweedFS (S3) and a real etcd. The metadata store is wrapped
(``FlakyMeta``) so that a chosen commit is applied or not and then reported failed; the
object store, so that a shared object's PUT fails. Every acknowledged record must be
served afterwards, from the cache, from the store and by the next broker; nothing named
may be deleted.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from broker.config import BrokerConfig
from broker.meta.base import open_meta
from broker.partition import AppendError, PartitionLog
from broker.server import Broker
from protocol.errors import ErrorCode
from segments.format import partition_prefix
from segments.shared import parse_directory, prefix
from segments.store import Buffer, ObjectStore, StoreError, open_store
from tests.fixtures.s3 import create_bucket
from tests.integration.broker.test_ambiguous_commits import (
    FlakyMeta,
    append,
    config,
    puts_under,
    values,
)

pytestmark = pytest.mark.integration

TOPIC = "shr"
PARTITIONS = 4


class FlakyPuts:
    """The real object store; the next ``fail`` PUTs of shared objects fail unwritten."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.fail = 0

    async def put_if_absent(
        self, key: str, data: Sequence[Buffer], *, crc32c: int | None = None
    ) -> str:
        if self.fail > 0 and "/@shared/" in key:
            self.fail -= 1
            raise StoreError(f"put {key}: injected")
        return await self.inner.put_if_absent(key, data, crc32c=crc32c)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


Node = tuple[Broker, FlakyMeta, FlakyPuts]


@pytest.fixture(params=["local", "s3-etcd"])
def cfg(request: pytest.FixtureRequest, tmp_path: Path) -> BrokerConfig:
    kw: dict[str, Any] = {"shared_objects_min_partitions": 2, "shared_sweep_interval_ms": 0}
    if request.param == "s3-etcd":
        endpoint = request.getfixturevalue("seaweedfs_s3")
        bucket = create_bucket(endpoint)
        kw |= {
            "store_url": endpoint.store_url(bucket, "kafscale"),
            "meta_url": request.getfixturevalue("etcd_url"),
            "meta_prefix": f"/shr-{uuid.uuid4().hex[:8]}",
        }
    return config(tmp_path, **kw)


async def start(cfg: BrokerConfig) -> Node:
    meta = FlakyMeta(open_meta(cfg.meta_url, cfg.data_dir, cfg.meta_prefix))
    store = FlakyPuts(open_store(cfg.store_url))
    b = Broker(cfg, meta=meta, store=store)
    await b.start()
    b.logs.committer.resolve_s = 0.5
    return b, meta, store


@pytest.fixture
async def node(cfg: BrokerConfig) -> AsyncIterator[Node]:
    b, meta, store = await start(cfg)
    await b.topics.create(TOPIC, PARTITIONS)
    try:
        yield b, meta, store
    finally:
        meta.match, meta.down = None, 0
        await b.stop()


async def cycle(b: Broker, logs: Sequence[PartitionLog], tag: str) -> list[ErrorCode]:
    """One batch to each of ``logs``, appended in one loop pass (so one flush cycle takes
    them all); per log the outcome its producer hears."""
    results = [append(b, lg, f"{tag}{lg.partition}") for lg in logs]
    out = []
    for res in results:
        assert res.done is not None
        try:
            await res.done
            out.append(ErrorCode.NONE)
        except AppendError as exc:
            out.append(exc.code)
    return out


def expected(tags: str, partition: int) -> list[bytes]:
    return [f"{t}{partition}-{j}".encode() for t in tags for j in range(2)]


async def shared_objects(b: Broker) -> list[str]:
    return [i.key for i in await b.store.list(prefix(b.config.namespace))]


async def partition_objects(b: Broker) -> list[str]:
    out = []
    for p in range(PARTITIONS):
        out += [i.key for i in await b.store.list(partition_prefix("default", TOPIC, p))]
    return out


async def take_all(b: Broker) -> list[PartitionLog]:
    return [await b.logs.get(TOPIC, p) for p in range(PARTITIONS)]


async def sweep(b: Broker, later_s: float = 0.0) -> list[str]:
    return await b.logs.shared_sweep.run_once(time.time() + later_s)


async def test_a_cycle_is_one_object_every_record_read_back(cfg: BrokerConfig) -> None:
    """Three cycles of four partitions: three shared objects and no other; each entry
    names a range of one; the directory names each partition's segment; every record
    reads back from the cache, from the store, and from the next broker."""
    b, _meta, _store = await start(cfg)
    try:
        await b.topics.create(TOPIC, PARTITIONS)
        logs = await three_cycles(b)
    finally:
        await b.stop()
    b2, _, _ = await start(cfg)
    try:
        for lg in await take_all(b2):
            assert await values(b2, lg) == expected("abc", lg.partition)
            assert lg.epoch > logs[lg.partition].epoch
    finally:
        await b2.stop()


async def three_cycles(b: Broker) -> list[PartitionLog]:
    logs = await take_all(b)
    for tag in "abc":
        assert await cycle(b, logs, tag) == [ErrorCode.NONE] * PARTITIONS
    keys = await shared_objects(b)
    assert len(keys) == 3 and await partition_objects(b) == []
    for lg in logs:
        assert [s.base for s in lg.segments] == [0, 2, 4]
        assert all(s.key.startswith("~") for s in lg.segments)
        assert {s.key.split("#")[0][1:] for s in lg.segments} == {k.rsplit("/", 1)[1] for k in keys}
    first = min(keys)
    ranges = parse_directory(first.rsplit("/", 1)[1], await b.store.get(first))
    assert sorted((r.topic, r.partition, r.base, r.epoch) for r in ranges) == [
        (TOPIC, p, 0, logs[p].epoch) for p in range(PARTITIONS)
    ]
    assert {r.entry_name for r in ranges} == {lg.segments[0].key for lg in logs}
    for lg in logs:
        assert await values(b, lg) == expected("abc", lg.partition)
    b.logs.cache.clear()
    for lg in logs:
        assert await values(b, lg) == expected("abc", lg.partition)
    return logs


async def test_below_the_threshold_each_partition_has_its_object(node: Node) -> None:
    b, _meta, _store = node
    b.config = replace(b.config, shared_objects_min_partitions=3)
    b.logs.config = b.config
    lg0, lg1 = (await take_all(b))[:2]
    assert await cycle(b, [lg0, lg1], "a") == [ErrorCode.NONE] * 2
    assert await shared_objects(b) == [] and len(await partition_objects(b)) == 2


async def test_merges_then_the_sweep_delete_it_only_when_nothing_names_it(
    node: Node,
) -> None:
    """Two shared objects of three partitions. Merging two of the partitions leaves both
    objects named by the third; once it is merged too, the sweep sees every segment dead,
    and deletes both a grace period after it first saw them so, not before."""
    b, _meta, _store = node
    b.config = replace(b.config, segment_delete_grace_ms=60_000)
    b.logs.config = b.logs.shared_sweep.config = b.config
    logs = (await take_all(b))[:3]
    for tag in "ab":
        assert await cycle(b, logs, tag) == [ErrorCode.NONE] * 3
    keys = await shared_objects(b)
    assert len(keys) == 2
    assert await sweep(b, 3600) == []  # named
    maint = b.logs.maintenance
    assert maint is not None
    for lg in logs[:2]:
        assert await maint.merge_partition(lg) == 1
        assert not lg.segments[0].key.startswith("~")  # merged into its own object
    assert await sweep(b, 3600) == [] and await sweep(b, 7200) == []  # the third names both
    assert await maint.merge_partition(logs[2]) == 1
    assert await sweep(b, 3600) == []  # first seen dead: a reader may hold an old entry
    assert await sweep(b, 3650) == []  # not yet a grace period later
    assert sorted(await sweep(b, 3661)) == sorted(keys)
    assert await shared_objects(b) == []
    b.logs.cache.clear()
    for lg in logs:
        assert await values(b, lg) == expected("ab", lg.partition)


async def test_a_failed_put_fails_the_cycle_retriably_and_leaves_nothing(node: Node) -> None:
    b, _meta, store = node
    logs = await take_all(b)
    store.fail = 1
    assert await cycle(b, logs, "a") == [ErrorCode.KAFKA_STORAGE_ERROR] * PARTITIONS
    assert await shared_objects(b) == [] and all(lg.hw == 0 for lg in logs)
    assert await cycle(b, logs, "a") == [ErrorCode.NONE] * PARTITIONS  # the retries
    assert len(await shared_objects(b)) == 1
    for lg in logs:
        assert await values(b, lg) == expected("a", lg.partition)


async def unknown_second_cycle(b: Broker, meta: FlakyMeta, applied: bool) -> list[PartitionLog]:
    """Two cycles of every partition; the second one's commit is applied (or not) and
    reported failed, and the store stays out of reach until its outcome is given up as
    unknown: its producers hear a retriable error. The store is back on return."""
    logs = await take_all(b)
    assert await cycle(b, logs, "a") == [ErrorCode.NONE] * PARTITIONS
    meta.arm(puts_under("/segments/"), apply=applied, down=1_000_000)
    assert await cycle(b, logs, "b") == [ErrorCode.KAFKA_STORAGE_ERROR] * PARTITIONS
    meta.down = 0
    return logs


async def test_an_applied_commit_reported_failed_keeps_its_object(node: Node) -> None:
    """The cycle's commit is applied and reported failed, and the store then stays out of
    reach: the producers hear a retriable error and the partitions are dropped. The sweep
    keeps the object (named), and the next take serves the records."""
    b, meta, _store = node
    await unknown_second_cycle(b, meta, applied=True)
    assert len(await shared_objects(b)) == 2
    assert await sweep(b, 3600) == []
    for lg in await take_all(b):
        assert await values(b, lg) == expected("ab", lg.partition)  # "b" was committed
    b.logs.cache.clear()
    assert await sweep(b, 3600) == [] and len(await shared_objects(b)) == 2
    for lg in await take_all(b):
        assert await values(b, lg) == expected("ab", lg.partition)


async def test_an_unapplied_commit_is_kept_until_no_commit_can_name_it(node: Node) -> None:
    """The cycle's commit is not applied and reported failed, and the store stays out of
    reach: its outcome is unknown. The sweep keeps the object while the partitions' ends
    stay at its segments' bases under the writer's epoch (a commit could still apply), and
    deletes it once the next take moved every end to a new epoch."""
    b, meta, _store = node
    logs = await unknown_second_cycle(b, meta, applied=False)
    keys = await shared_objects(b)
    assert len(keys) == 2
    assert await sweep(b, 3600) == []  # unknown: maybe still applied
    logs2 = await take_all(b)
    assert all(lg.epoch > old.epoch for lg, old in zip(logs2, logs, strict=True))
    orphan = max(keys)  # names sort by sequence: the second cycle's
    assert await sweep(b, 3600) == [orphan]  # grace 0: deleted on the pass that saw it dead
    for lg in logs2:
        assert await values(b, lg) == expected("a", lg.partition)
    assert await cycle(b, logs2, "b") == [ErrorCode.NONE] * PARTITIONS  # the retries
    b.logs.cache.clear()
    for lg in logs2:
        assert await values(b, lg) == expected("ab", lg.partition)


async def test_a_rejected_commit_is_kept_until_the_partition_moves_on(node: Node) -> None:
    """Reported failed, not applied, and the store reachable: the resolution settles it as
    never applied (retriable for the producers). Its object is kept while the ends stay at
    its bases (nothing yet shows the commit can never apply), and deleted once the next
    commit moved every end past them."""
    b, meta, _store = node
    logs = await take_all(b)
    meta.arm(puts_under("/segments/"), apply=False)
    assert await cycle(b, logs, "a") == [ErrorCode.KAFKA_STORAGE_ERROR] * PARTITIONS
    (orphan,) = await shared_objects(b)
    assert await sweep(b, 3600) == []
    assert await cycle(b, logs, "a") == [ErrorCode.NONE] * PARTITIONS
    assert await sweep(b, 3600) == [orphan]
    b.logs.cache.clear()
    for lg in logs:
        assert await values(b, lg) == expected("a", lg.partition)


def test_a_broker_process_shares_objects_with_real_clients_and_sweeps_them(
    tmp_path: Path,
) -> None:
    """The flags reach a broker process: kafka-python's producer (every partition of the
    broker in one ProduceRequest) writes six partitions in three flush cycles, each one
    shared object; librdkafka reads every record back; merges then copy the ranges into
    per-partition segments and the controller's sweep deletes the three objects; after a
    restart a consumer still reads every record."""
    from kafka import KafkaProducer

    from tests.fixtures.broker import free_port, start_broker
    from tests.integration.backends import consume_all
    from tests.integration.conftest import create_topic, unique_topic
    from tests.integration.kafka_raw import metrics

    http = free_port()
    args = (
        "--http", f"127.0.0.1:{http}",
        "--shared-objects-min-partitions", "2",
        "--flush-when-idle", "false", "--flush-interval-ms", "200",  # a request per cycle
        "--merge-interval-ms", "300", "--merge-min-age-ms", "0", "--merge-min-segments", "3",
        "--segment-delete-grace-ms", "0", "--shared-sweep-interval-ms", "300",
    )  # fmt: skip
    shared_dir = tmp_path / "data" / "default" / "@shared"
    proc = start_broker(tmp_path, store_url=f"file://{tmp_path / 'data'}", extra_args=args)
    topic = unique_topic("shared")
    want: dict[int, list[bytes]] = {p: [] for p in range(6)}
    try:
        create_topic(proc.bootstrap, topic, 6)
        producer = KafkaProducer(bootstrap_servers=proc.bootstrap, acks="all", linger_ms=50)
        for rnd in range(3):
            for p in range(6):
                for i in range(5):
                    value = f"r{rnd}-p{p}-{i}".encode()
                    producer.send(topic, value=value, partition=p)
                    want[p].append(value)
            producer.flush(60)
        producer.close()
        got = consume_all(proc.bootstrap, topic, 6, 90, timeout=120)
        assert {p: [v for _o, _k, v in recs] for p, recs in got.items()} == want
        written = metrics(http)["kafscale_shared_objects_total"]  # (some may be swept)
        assert written >= 3 and metrics(http)["kafscale_shared_segments_total"] == 18
        deadline = time.monotonic() + 240
        while any(shared_dir.iterdir()):  # merged, then swept by the loops
            assert time.monotonic() < deadline, "the shared objects were never swept"
            time.sleep(0.2)  # polls the store, not a timing assumption
        assert metrics(http)["kafscale_shared_objects_deleted_total"] == written
    finally:
        proc.stop()
    proc = start_broker(tmp_path, store_url=f"file://{tmp_path / 'data'}", extra_args=args)
    try:
        got = consume_all(proc.bootstrap, topic, 6, 90, timeout=120)
        assert {p: [v for _o, _k, v in recs] for p, recs in got.items()} == want
    finally:
        proc.stop()


async def test_deleted_and_recreated_topics_release_their_ranges(node: Node) -> None:
    """One shared object holds two topics' segments. Deleting one topic leaves it named by
    the other; a topic created again under the deleted name (another topic id) does not
    name the old ranges; once the second topic is deleted too the sweep deletes it."""
    b, _meta, _store = node
    await b.topics.create("other", 2)
    logs = await take_all(b) + [await b.logs.get("other", p) for p in range(2)]
    assert await cycle(b, logs, "a") == [ErrorCode.NONE] * (PARTITIONS + 2)
    (key,) = await shared_objects(b)
    topics = {r.topic for r in parse_directory(key.rsplit("/", 1)[1], await b.store.get(key))}
    assert topics == {TOPIC, "other"}
    await b.topics.delete(TOPIC)
    await b.topics.wait_background()
    assert await sweep(b, 3600) == []  # "other" still names its ranges
    await b.topics.create(TOPIC, PARTITIONS)
    again = await take_all(b)
    assert await cycle(b, again, "n") == [ErrorCode.NONE] * PARTITIONS
    assert await sweep(b, 3600) == []
    await b.topics.delete("other")
    await b.topics.wait_background()
    assert await sweep(b, 3600) == [key]
    b.logs.cache.clear()
    for lg in again:
        assert await values(b, lg) == expected("n", lg.partition)


async def test_an_idle_partitions_lone_range_is_copied_out(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partitions that write once and go idle have one small segment each, never enough
    to merge: their ranges would keep the shared object forever. Once a range has waited
    ``SHARED_RELEASE_S`` (here 0) it is merged alone into an object of its own, and the
    sweep then deletes the shared object."""
    b, _meta, _store = node
    logs = await take_all(b)
    assert await cycle(b, logs, "a") == [ErrorCode.NONE] * PARTITIONS
    (key,) = await shared_objects(b)
    maint = b.logs.maintenance
    assert maint is not None
    assert [await maint.merge_partition(lg) for lg in logs] == [0] * PARTITIONS  # too young
    monkeypatch.setattr("broker.merging.SHARED_RELEASE_S", 0.0)
    assert [await maint.merge_partition(lg) for lg in logs] == [1] * PARTITIONS
    assert not any(lg.segments[0].key.startswith("~") for lg in logs)
    assert await sweep(b, 3600) == [key]
    b.logs.cache.clear()
    for lg in logs:
        assert await values(b, lg) == expected("a", lg.partition)


async def test_an_entry_the_sweep_cannot_read_keeps_the_object(node: Node) -> None:
    """A manifest entry that does not decode (a corrupt metadata value): the sweep logs it
    and keeps the object, and the pass goes on with the next object."""
    b, _meta, _store = node
    logs = await take_all(b)
    for tag in "ab":
        assert await cycle(b, logs, tag) == [ErrorCode.NONE] * PARTITIONS
    first, second = sorted(await shared_objects(b))
    maint = b.logs.maintenance
    assert maint is not None
    for lg in logs[1:]:
        assert await maint.merge_partition(lg) == 1
    await b.meta.put(f"/logs/{TOPIC}/0/segments/-corrupt", b"{")  # sorts before the entries
    assert await sweep(b, 3600) == []  # kept: it cannot tell, so it does not guess
    await b.meta.delete(f"/logs/{TOPIC}/0/segments/-corrupt")
    assert await maint.merge_partition(logs[0]) == 1
    assert sorted(await sweep(b, 3600)) == [first, second]
