"""A broker is placed on only while it serves (broker/cluster.py; docs/architecture.md,
"Ownership"), on real etcd with real broker processes.

A starting broker registers ``/brokers/{id}`` before its listeners accept connections,
and a stopping one keeps its registration until it has released what it holds. Counted
by the others in those windows, it was named leader of partitions and coordinator of
groups that nobody could reach. Each test freezes broker 2 in such a window, at a fault
checkpoint (``start.before_serving``, ``stop.after_withdraw``), with a lease far longer
than the test so that only its registration's ``serving`` mark can keep it out, and
checks that broker 1 places everything on itself, serves it, and loses nothing when
broker 2 wakes up.
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from broker.cluster import BrokerInfo, rendezvous
from broker.meta.base import open_meta
from broker.meta.schema import BrokerRecord, broker_key
from tests.integration import kafka_raw as kr
from tests.integration.zombie_cluster import (
    WAIT,
    ZCluster,
    assert_exactly,
    topic_owned_by,
)

# placement does not depend on the store: the shared directory store with etcd only (the
# durability tests' ``zc`` runs SeaweedFS as well)
pytestmark = [pytest.mark.integration, pytest.mark.parametrize("zc", ["file"], indirect=True)]

PARTITIONS = 4
LONG_LEASE = ("--lease-ttl", "60")  # outlives the test: only the mark keeps broker 2 out
FAKE_NODE = 3  # a registration put by the test itself, to order etcd's events


def group_owned_by(node: int, nodes: list[int]) -> str:
    infos = [BrokerInfo(n, "127.0.0.1", 0) for n in nodes]
    for i in range(10_000):
        winner = rendezvous(f"g\x00serving-{i}", infos)
        if winner is not None and winner.node_id == node:
            return f"serving-{i}"
    raise AssertionError("no such group id")


def coordinator(port: int, group: str) -> int:
    with kr.RawConn(port) as c:
        req = FindCoordinatorRequest(key=group, key_type=0, coordinator_keys=[group])
        res = c.call(req, FindCoordinatorResponse, 1)
    assert res.error_code == 0, res
    return int(res.node_id)


def placement(port: int, topic: str) -> tuple[list[int], list[int]]:
    """(the brokers Metadata lists, the leader of each partition) as broker ``port`` sees
    them."""
    md = kr.metadata(port, [topic])
    (t,) = md.topics
    assert t.error_code == 0, t
    leaders = [p.leader_id for p in sorted(t.partitions, key=lambda p: p.partition_index)]
    return sorted(b.node_id for b in md.brokers), leaders


def wait_placement(port: int, topic: str, brokers: list[int]) -> list[int]:
    """Wait until broker ``port`` lists exactly ``brokers``; the partitions' leaders."""
    deadline = time.monotonic() + WAIT
    while True:  # another process's view: polled
        listed, leaders = placement(port, topic)
        if listed == brokers:
            return leaders
        assert time.monotonic() < deadline, f"brokers listed {listed}, never {brokers}"
        time.sleep(0.05)


async def _registration(zc: ZCluster, node: int) -> BrokerRecord | None:
    b = zc.backend
    meta = open_meta(b.meta_url, prefix=b.meta_prefix)
    try:
        kv = await meta.get(broker_key(node))
        return None if kv is None else BrokerRecord.from_json(kv.value)
    finally:
        await meta.close()


async def _put_fake(zc: ZCluster, port: int, present: bool) -> None:
    b = zc.backend
    meta = open_meta(b.meta_url, prefix=b.meta_prefix)
    try:
        if present:
            await meta.put(broker_key(FAKE_NODE), BrokerRecord("127.0.0.1", port).to_json())
        else:
            await meta.delete(broker_key(FAKE_NODE))
    finally:
        await meta.close()


def seen_up_to_now(zc: ZCluster, topic: str, brokers: list[int]) -> None:
    """Make sure broker 1 has applied every membership event written so far: a serving
    registration put now is applied after them (one watch, in revision order); once
    broker 1 lists it, it is taken out again."""
    port = zc.brokers[1].port
    asyncio.run(_put_fake(zc, port, True))
    wait_placement(port, topic, sorted([*brokers, FAKE_NODE]))
    asyncio.run(_put_fake(zc, port, False))
    wait_placement(port, topic, brokers)


def create(zc: ZCluster, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": zc.brokers[1].bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS)])[topic].result(30)


def values(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


def test_a_starting_broker_is_handed_nothing_before_it_serves(zc: ZCluster) -> None:
    zc.start(1)
    topic = topic_owned_by("starting", 2, [1, 2])  # partition 0 hashes to broker 2
    group = group_owned_by(2, [1, 2])
    create(zc, topic)
    acked = zc.produce(topic, 0, values("before", 3))

    zc.start(2, *LONG_LEASE, pause_at="start.before_serving")
    zc.wait_frozen_at_checkpoint(2, "start.before_serving")
    rec = asyncio.run(_registration(zc, 2))
    assert rec is not None and rec.serving is False, rec  # registered, not serving
    seen_up_to_now(zc, topic, [1])

    port = zc.brokers[1].port
    assert placement(port, topic) == ([1], [1] * PARTITIONS)
    assert coordinator(port, group) == 1
    for p in range(PARTITIONS):  # served meanwhile, by broker 1
        got = zc.produce(topic, p, values(f"frozen-{p}", 2))
        if p == 0:
            acked |= got

    zc.wake(2)
    leaders = wait_placement(port, topic, [1, 2])
    assert leaders[0] == 2
    assert coordinator(port, group) == 2
    rec = asyncio.run(_registration(zc, 2))
    assert rec is not None and rec.serving is True, rec
    acked |= zc.produce(topic, 0, values("after", 3))  # through broker 2 now
    assert_exactly(zc.read(topic, 0), acked)


def test_a_stopping_broker_is_placed_elsewhere_before_it_releases(zc: ZCluster) -> None:
    zc.start(1)
    zc.start(2, *LONG_LEASE, pause_at="stop.after_withdraw")
    topic = topic_owned_by("stopping", 2, [1, 2])
    group = group_owned_by(2, [1, 2])
    create(zc, topic)
    port = zc.brokers[1].port
    assert wait_placement(port, topic, [1, 2])[0] == 2
    acked = zc.produce(topic, 0, values("before", 5))  # held by broker 2

    zc.brokers[2].proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    zc.wait_frozen_at_checkpoint(2, "stop.after_withdraw")
    # broker 2's lease lives on (60 s) and it still holds partition 0: only the mark
    # takes it out of broker 1's placement
    rec = asyncio.run(_registration(zc, 2))
    assert rec is not None and rec.serving is False, rec
    assert wait_placement(port, topic, [1]) == [1] * PARTITIONS
    assert asyncio.run(_registration(zc, 2)) is not None  # still registered
    assert coordinator(port, group) == 1

    zc.wake(2)  # its stop goes on: flush, release, revoke; broker 1 takes partition 0
    assert zc.brokers[2].proc is not None
    assert zc.brokers[2].proc.wait(WAIT) == 0
    acked |= zc.produce(topic, 0, values("after", 3))
    assert_exactly(zc.read(topic, 0), acked)
