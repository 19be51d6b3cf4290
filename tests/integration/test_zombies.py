"""A broker frozen at the exact point before it deletes or writes objects, woken after
another broker took its partition over, committed and merged: every acknowledged record
still reads back, from the live cluster and after a cold restart (docs/format.md,
"Deleting objects"; broker/faults.py for the checkpoints).

Two brokers share etcd and a store (a directory, or SeaweedFS). Broker 1 is started with
``KAFSCALE_FAULT_PAUSE=<checkpoint>`` and stops itself (SIGSTOP) the first time it gets
there; its lease (2 s) expires, broker 2 takes the partition, and the test resumes broker
1 (SIGCONT) once broker 2 has done what could collide with the zombie's late action.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from broker.meta.base import open_meta
from segments.format import parse_object_name
from segments.store import open_store
from tests.integration import kafka_raw as kr
from tests.integration.logcheck import Backend, check_partition
from tests.integration.zombie_cluster import (
    FAST_MAINTENANCE,
    WAIT,
    ZCluster,
    assert_exactly,
    topic_owned_by,
)

pytestmark = pytest.mark.integration


def create(bootstrap: str, topic: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions)])[topic].result(30)


async def _manifest(backend: Backend, topic: str) -> list[dict[str, Any]]:
    meta = open_meta(backend.meta_url, prefix=backend.meta_prefix)
    try:
        kvs = await meta.range(f"/logs/{topic}/0/segments/")
        return [json.loads(kv.value) for kv in kvs]
    finally:
        await meta.close()


def wait_manifest(backend: Backend, topic: str, ok: Any, what: str) -> list[dict[str, Any]]:
    """Poll the manifest in etcd until ``ok(entries)``."""
    deadline = time.monotonic() + WAIT
    entries: list[dict[str, Any]] = []
    while time.monotonic() < deadline:  # state written by another process: polled
        entries = asyncio.run(_manifest(backend, topic))
        if ok(entries):
            return entries
        time.sleep(0.1)
    raise AssertionError(f"never {what}: {entries}")


def epoch_of(entry: dict[str, Any]) -> int | None:
    name = parse_object_name(str(entry.get("key", "")))
    return None if name is None else name.epoch


def merged_by_newer_owner(first_epoch: int, last: int) -> Any:
    """The manifest is one segment up to ``last`` (at least), written after the zombie's
    epoch ``first_epoch`` (the partition's first owner has epoch 1)."""

    def ok(entries: list[dict[str, Any]]) -> bool:
        return (
            len(entries) == 1
            and int(entries[0]["last"]) >= last
            and (epoch_of(entries[0]) or 0) > first_epoch
        )

    return ok


def verify(zc: ZCluster, topic: str, acked: dict[bytes, int]) -> None:
    """Every acknowledged record, live and after a cold restart of every broker."""
    assert_exactly(zc.read(topic, 0), acked)
    check_partition(zc.backend, topic, 0)
    zc.restart_all()
    assert_exactly(zc.read(topic, 0), acked)
    check_partition(zc.backend, topic, 0)


def values(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


def two_brokers(zc: ZCluster, point: str, *zombie_args: str) -> str:
    zc.start(1, *FAST_MAINTENANCE, *zombie_args, pause_at=point)
    zc.start(2, *FAST_MAINTENANCE)
    topic = topic_owned_by(point.replace(".", "-"), 1, [1, 2])
    create(zc.brokers[2].bootstrap, topic)
    return topic


def test_zombie_merge_commit_deletes_nothing(zc: ZCluster) -> None:
    """Frozen after uploading a merge, before committing it, while the new owner merges
    the very same run: the zombie's failed commit must not delete anything."""
    topic = two_brokers(zc, "merge.before_commit", "--merge-min-segments", "6")
    acked = zc.produce(topic, 0, values("a", 6))
    zc.wait_frozen_at_checkpoint(1, "merge.before_commit")
    assert_exactly(zc.read(topic, 0), acked)  # broker 2 takes the partition to serve it
    wait_manifest(zc.backend, topic, merged_by_newer_owner(1, 5), "merged by broker 2")
    zc.wake(1)
    acked |= zc.produce(topic, 0, values("b", 4))
    verify(zc, topic, acked)
    assert "fenced" in zc.brokers[1].log_text() or "lease expired" in zc.brokers[1].log_text()


def test_zombie_sweep_woken_before_listing(zc: ZCluster) -> None:
    """Frozen as its sweep begins, woken after the new owner committed and merged objects
    the zombie's manifest never heard of: the sweep reads the manifest fresh, under its
    owner guard, finds itself fenced and deletes nothing."""
    topic = two_brokers(zc, "sweep.before_list")
    acked = zc.produce(topic, 0, values("a", 3))
    zc.wait_frozen_at_checkpoint(1, "sweep.before_list")
    acked |= zc.produce(topic, 0, values("b", 4))  # broker 2, after the lease expired
    wait_manifest(zc.backend, topic, merged_by_newer_owner(1, 6), "merged by broker 2")
    zc.wake(1)
    verify(zc, topic, acked)


def test_zombie_sweep_woken_before_deleting(zc: ZCluster) -> None:
    """Frozen between choosing its victims (a stray object) and deleting them: what it
    deletes after waking was garbage for good, whatever the new owner did meanwhile."""
    zc.start(1, *FAST_MAINTENANCE, pause_at="sweep.before_delete")
    zc.start(2, *FAST_MAINTENANCE)
    topic = topic_owned_by("sweep-delete", 1, [1, 2])
    stray = f"default/{topic}/0/segment-00000000000000000000-00000000000000000009.kfs"

    async def plant() -> None:
        store = open_store(zc.backend.store_url)
        try:
            await store.put_if_absent(stray, [b"left by a crashed writer"])
        finally:
            await store.close()

    asyncio.run(plant())
    create(zc.brokers[2].bootstrap, topic)
    acked = zc.produce(topic, 0, values("a", 3))
    zc.wait_frozen_at_checkpoint(1, "sweep.before_delete")
    acked |= zc.produce(topic, 0, values("b", 4))
    wait_manifest(zc.backend, topic, merged_by_newer_owner(1, 6), "merged by broker 2")
    zc.wake(1)
    verify(zc, topic, acked)


def test_zombie_retirement_woken_before_deleting(zc: ZCluster) -> None:
    """Frozen after checking ownership for the delayed delete of merged-away segments:
    the new owner merges again on top of the zombie's merge; nothing it reads is lost."""
    topic = two_brokers(zc, "retire.before_delete", "--merge-min-segments", "4")
    acked = zc.produce(topic, 0, values("a", 4))
    zc.wait_frozen_at_checkpoint(1, "retire.before_delete")
    acked |= zc.produce(topic, 0, values("b", 3))
    wait_manifest(zc.backend, topic, merged_by_newer_owner(1, 6), "merged by broker 2")
    zc.wake(1)
    acked |= zc.produce(topic, 0, values("c", 2))
    verify(zc, topic, acked)


def test_zombie_topic_deletion_spares_the_recreated_topic(zc: ZCluster) -> None:
    """Frozen while deleting a topic's objects; meanwhile the topic is created again and
    written: the zombie, woken, removes the old incarnation's objects only."""
    zc.start(1, *FAST_MAINTENANCE, pause_at="topic.before_list")
    zc.start(2, *FAST_MAINTENANCE)
    topic = topic_owned_by("topic-delete", 1, [1, 2])
    create(zc.brokers[2].bootstrap, topic)
    zc.produce(topic, 0, values("old", 3))
    admin = AdminClient({"bootstrap.servers": zc.brokers[1].bootstrap})
    admin.delete_topics([topic])  # broker 1 may freeze before it even answers
    zc.wait_frozen_at_checkpoint(1, "topic.before_list")
    deadline = time.monotonic() + WAIT
    while True:  # broker 2 learns of the deletion through its watch
        try:
            create(zc.brokers[2].bootstrap, topic)
            break
        except Exception:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    acked = zc.produce(topic, 0, values("new", 5))
    wait_manifest(zc.backend, topic, merged_by_newer_owner(0, 4), "merged by broker 2")
    zc.wake(1)
    # the woken broker finishes deleting, then takes the partition back (it hashes there)
    deadline = time.monotonic() + WAIT
    while "deleted" not in zc.brokers[1].log_text().split("fault checkpoint")[-1]:
        assert time.monotonic() < deadline, "the woken broker never finished its deletion"
        time.sleep(0.1)
    verify(zc, topic, acked)


def test_zombie_flush_woken_before_its_puts(zc: ZCluster) -> None:
    """Frozen with a segment built and not yet written, while the new owner commits other
    records at the same offsets: the zombie's late write takes a name of its own, its
    commit is fenced, and its producer is never told the records were written."""
    topic = two_brokers(zc, "flush.before_put")
    verify(zc, topic, late_produce_of_a_zombie(zc, topic, "flush.before_put"))


def late_produce_of_a_zombie(zc: ZCluster, topic: str, point: str) -> dict[bytes, int]:
    """Broker 1 gets a produce and freezes at ``point``; broker 2 takes the partition
    over, commits 5 records at the same offsets and merges them; broker 1 is woken. Its
    producer must never hear that its record was written. Returns broker 2's acks."""
    late = kr.RawConn(zc.brokers[1].port, timeout=WAIT)
    try:
        late.send(
            kr.request_bytes(kr.produce_request(topic, 0, kr_batch(b"ZOMBIE")), 8, correlation_id=7)
        )
        zc.wait_frozen_at_checkpoint(1, point)
        acked = zc.produce(topic, 0, values("b", 5))
        assert sorted(acked.values()) == [0, 1, 2, 3, 4]  # the same offsets as the zombie's
        wait_manifest(zc.backend, topic, merged_by_newer_owner(1, 4), "merged by broker 2")
        zc.wake(1)
        data = late.recv_frame()
        if data is not None:  # an answer, if any, is an error, never an acknowledgement
            resp = kr.ProduceResponse.decode(data, version=8, header=True)
            assert resp.responses[0].partition_responses[0].error_code != 0
    finally:
        late.close()
    return acked


def kr_batch(value: bytes) -> bytes:
    from protocol.records import build_batch

    return build_batch([(None, value, None)])
