"""A woken zombie's serving mark leaves its successor's registration alone (broker/cluster.py,
``Cluster._mark``), on a real etcd.

The zombie's lease is revoked behind its back (as when it expired while the process was
frozen) and a new incarnation of the same node id registers and serves. The zombie still
believes its lease alive, as a process that has just woken up does, and marks its
registration not serving (a stop) and serving (a start): each write compares the create
revision of the registration it made, so neither touches the successor's, which every
broker goes on counting.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from broker.cluster import Cluster
from broker.config import BrokerConfig
from broker.meta.base import KeyValue
from broker.meta.etcd import EtcdStore
from broker.meta.schema import BrokerRecord, broker_key

pytestmark = pytest.mark.integration

TTL = 30  # no keep-alive of the zombie's runs during the test


@pytest.fixture
async def stores(etcd_url: str) -> AsyncIterator[list[EtcdStore]]:
    prefix = f"/zmark-{uuid.uuid4().hex[:8]}"
    out = [EtcdStore.from_url(etcd_url, prefix=prefix) for _ in range(3)]
    try:
        yield out
    finally:
        for s in out:
            await s.close()


async def _registration(store: EtcdStore) -> KeyValue:
    kv = await store.get(broker_key(2))
    assert kv is not None
    return kv


async def test_a_woken_zombie_marks_nothing_of_its_successor(stores: list[EtcdStore]) -> None:
    zombie = Cluster(stores[0], BrokerConfig(node_id=2, advertised_port=9002, lease_ttl_s=TTL))
    successor = Cluster(stores[1], BrokerConfig(node_id=2, advertised_port=9102, lease_ttl_s=TTL))
    observer = Cluster(stores[2], BrokerConfig(node_id=1, advertised_port=9001, lease_ttl_s=TTL))
    changed = asyncio.Event()
    observer.add_listener(changed.set)
    try:
        await observer.start()
        await observer.serve()
        await zombie.start()
        await zombie.serve()
        await stores[1].revoke_lease(zombie.lease_id)  # expired while it was frozen
        await successor.start()
        await successor.serve()
        before = await _registration(stores[1])
        assert before.create_revision == successor.reg != zombie.reg
        assert zombie.lease_valid()  # what the woken zombie believes

        await zombie.withdraw()  # the zombie is told to stop...
        await zombie.serve()  # ...or goes on starting
        after = await _registration(stores[1])
        assert (after.mod_revision, after.value) == (before.mod_revision, before.value)
        assert BrokerRecord.from_json(after.value) == BrokerRecord("127.0.0.1", 9102)

        async with asyncio.timeout(30):  # the observer counts the successor, at its port
            while (b := observer.broker(2)) is None or b.port != 9102:
                await changed.wait()
                changed.clear()
    finally:
        for c in (zombie, successor, observer):
            await c.stop()
