"""Membership counts serving brokers only (broker/cluster.py): a registration is written
"not serving", marked serving once the broker listens (``serve``) and "not serving"
again when it stops (``withdraw``). Two ``Cluster``s on one embedded store (no process;
the same on etcd: tests/integration/broker/test_cluster_serving.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from broker.cluster import Cluster
from broker.config import BrokerConfig
from broker.meta.base import MetaStore
from broker.meta.schema import BrokerRecord, broker_key

WAIT = 30.0
FAKE = 9  # a registration the test puts itself: a marker in the watch's event order


@pytest.fixture
async def pair(meta: MetaStore) -> AsyncIterator[tuple[Cluster, Cluster]]:
    a = Cluster(meta, BrokerConfig(node_id=1, advertised_port=9001, lease_ttl_s=30))
    b = Cluster(meta, BrokerConfig(node_id=2, advertised_port=9002, lease_ttl_s=30))
    try:
        yield a, b
    finally:
        await b.stop()
        await a.stop()


@pytest.fixture
async def serving(pair: tuple[Cluster, Cluster]) -> tuple[Cluster, Cluster]:
    """Both started and serving, and each counted by the other."""
    for c in pair:
        await c.start()
        await c.serve()
    await counted(pair[0], [1, 2])
    return pair


async def counted(c: Cluster, ids: list[int]) -> None:
    """Wait until ``c`` counts exactly ``ids`` (its membership watch is a task)."""
    changed = asyncio.Event()
    c.add_listener(changed.set)
    async with asyncio.timeout(WAIT):
        while [x.node_id for x in c.brokers()] != ids:
            await changed.wait()
            changed.clear()


async def applied_so_far(meta: MetaStore, c: Cluster, ids: list[int]) -> None:
    """Wait until ``c`` has applied every registration event written so far: a serving
    one put now comes after them in its watch."""
    await meta.put(broker_key(FAKE), BrokerRecord("127.0.0.1", 9009).to_json())
    await counted(c, sorted([*ids, FAKE]))
    await meta.delete(broker_key(FAKE))
    await counted(c, ids)


async def stored(meta: MetaStore, node: int) -> BrokerRecord:
    kv = await meta.get(broker_key(node))
    assert kv is not None
    return BrokerRecord.from_json(kv.value)


async def test_a_registered_broker_is_counted_once_it_serves(
    meta: MetaStore, pair: tuple[Cluster, Cluster]
) -> None:
    a, b = pair
    await a.start()
    await a.serve()
    await b.start()
    assert not (await stored(meta, 2)).serving
    await applied_so_far(meta, a, [1])
    # b is placed on by nobody, itself included: every key goes to a
    assert [x.node_id for x in b.brokers()] == [1]
    keys = [f"topic-{i}" for i in range(20)]
    assert {b.partition_owner(k, 0).node_id for k in keys} == {1}
    assert {a.group_coordinator(k).node_id for k in keys} == {1}
    assert b.controller_id() == a.controller_id() == 1

    await b.serve()
    assert (await stored(meta, 2)).serving
    assert [x.node_id for x in b.brokers()] == [1, 2]  # at once, in its own view
    await counted(a, [1, 2])
    owners = [a.partition_owner(k, 0).node_id for k in keys]
    assert set(owners) == {1, 2}  # both place, and agree
    assert owners == [b.partition_owner(k, 0).node_id for k in keys]


async def test_a_withdrawn_broker_is_dropped_by_the_others_not_by_itself(
    meta: MetaStore, serving: tuple[Cluster, Cluster]
) -> None:
    a, b = serving
    await b.withdraw()
    assert not (await stored(meta, 2)).serving  # still registered: the lease lives
    await counted(a, [1])
    assert [x.node_id for x in b.brokers()] == [1, 2]  # its stop releases what it holds
    await b._sync_brokers()  # as after a failed watch: it reads every registration again
    assert [x.node_id for x in b.brokers()] == [1, 2]


async def test_a_registration_written_again_after_a_lost_lease_is_serving(
    meta: MetaStore, serving: tuple[Cluster, Cluster]
) -> None:
    a, b = serving
    lost = b.lease_id
    await meta.revoke_lease(lost)  # its registration is deleted with it
    await counted(a, [1])
    b.check_lease()  # the keep-alive finds the lease gone and registers again
    await counted(a, [1, 2])
    assert b.lease_id != lost
    assert (await stored(meta, 2)).serving


def test_a_record_from_before_the_serving_mark_is_serving() -> None:
    old = b'{"host": "h", "port": 9092, "rack": null}'
    assert BrokerRecord.from_json(old) == BrokerRecord("h", 9092, None, (), True)


def test_a_record_round_trips() -> None:
    rec = BrokerRecord("h", 1, "r1", (("INTERNAL", "10.0.0.1", 9093),), False)
    assert BrokerRecord.from_json(rec.to_json()) == rec


@pytest.mark.parametrize(
    "value", [b"", b"[]", b"{}", b'{"host": "h"}', b'{"host": "h", "port": "x"}', b"\xff"]
)
def test_an_unreadable_record_is_a_value_error(value: bytes) -> None:
    with pytest.raises(ValueError):
        BrokerRecord.from_json(value)
