"""EtcdStore streams whose shared gRPC channel is closed under them, on a real etcd.

Every call of an ``EtcdStore`` shares one channel; a call that fails with a connection
error drops it (``_drop``), and closing it cancels every other call on it. During an etcd
outage that happens many times a second. A lease keep-alive or a watch caught by it is
sent again on a new channel or ends with ``MetaStoreError`` (its caller retries); it
neither hangs nor ends with a bare ``CancelledError``. Either used to leave a broker's
keep-alive or membership watch dead while the process ran on, so that a broker never
rejoined after an etcd outage (test_etcd_outage.py).

The drop is made at the exact point by calling ``_drop``, as a failing call does.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from broker.cluster import Cluster
from broker.config import BrokerConfig
from broker.meta.base import MetaStoreError
from broker.meta.etcd import EtcdStore
from broker.meta.schema import broker_key

pytestmark = pytest.mark.integration

CALL_TIMEOUT = 2.0  # the store's per-call timeout
WAIT = 30.0  # generous: far beyond any answer on a busy machine, short of a hang


@pytest.fixture
async def store(etcd_url: str) -> AsyncIterator[EtcdStore]:
    s = EtcdStore.from_url(etcd_url, prefix=f"/drop-{uuid.uuid4().hex[:8]}", timeout=CALL_TIMEOUT)
    try:
        yield s
    finally:
        await s.close()


async def drop_channel(store: EtcdStore) -> None:
    """What a call failing with UNAVAILABLE does: close the shared channel."""
    assert store._client is not None
    await store._drop(store._client)


async def test_keepalive_whose_channel_closes_before_it_is_sent_is_retried(
    store: EtcdStore,
) -> None:
    lease = await store.grant_lease(30)
    refresh = asyncio.create_task(store.refresh_lease(lease))
    await asyncio.sleep(0)  # the keep-alive stream is open, its headers not yet sent
    await drop_channel(store)
    async with asyncio.timeout(WAIT):  # it used to wait for its headers forever
        ttl = await refresh  # sent again on a new channel
    assert 0 < ttl <= 30


async def test_watch_whose_channel_closes_before_it_is_sent_fails(store: EtcdStore) -> None:
    await store.get("/k")  # the channel is open
    watch = store.watch("/w/")
    first = asyncio.create_task(anext(watch))
    await asyncio.sleep(0)  # the watch stream is open, its create request not yet sent
    await drop_channel(store)
    async with asyncio.timeout(WAIT):  # it used to wait for its headers forever
        (outcome,) = await asyncio.gather(first, return_exceptions=True)
    assert isinstance(outcome, MetaStoreError), repr(outcome)


async def test_watch_whose_channel_closes_under_it_fails(store: EtcdStore) -> None:
    rev = await store.put("/w/a", b"1")
    watch = store.watch("/w/", start_revision=rev)
    assert (await anext(watch)).key == "/w/a"  # established
    pending = asyncio.create_task(anext(watch))
    await asyncio.sleep(0)  # it waits for the next event
    await drop_channel(store)
    async with asyncio.timeout(WAIT):
        (outcome,) = await asyncio.gather(pending, return_exceptions=True)
    # a bare CancelledError used to end the task that consumed the watch, silently
    assert isinstance(outcome, MetaStoreError), repr(outcome)


async def wait_seen(c: Cluster, changed: asyncio.Event, node_id: int) -> None:
    async with asyncio.timeout(WAIT):
        while c.broker(node_id) is None:
            await changed.wait()
            changed.clear()


async def test_cluster_sees_a_broker_that_joins_after_its_channel_closed(
    etcd_url: str,
) -> None:
    prefix = f"/drop-{uuid.uuid4().hex[:8]}"
    stores = [EtcdStore.from_url(etcd_url, prefix=prefix, timeout=CALL_TIMEOUT) for _ in "ab"]
    a = Cluster(stores[0], BrokerConfig(node_id=1, advertised_port=9001, lease_ttl_s=5))
    b = Cluster(stores[1], BrokerConfig(node_id=2, advertised_port=9002, lease_ttl_s=5))
    changed = asyncio.Event()
    a.add_listener(changed.set)
    try:
        await a.start()
        await a.serve()
        # a broker record put after a started reaches it only through its membership watch:
        # once a sees it, that watch is established on the channel about to be closed
        record = b'{"host": "127.0.0.1", "port": 9003, "rack": null}'
        await stores[1].put(broker_key(3), record)
        await wait_seen(a, changed, 3)
        await drop_channel(stores[0])
        await b.start()
        await b.serve()
        await wait_seen(a, changed, 2)  # through its watch again, or a resync after it
        assert [x.node_id for x in a.brokers()] == [1, 2, 3]
        assert not any(t.done() for t in a._tasks), "a cluster task ended"
    finally:
        await b.stop()
        await a.stop()
        await stores[1].delete(broker_key(3))
        for s in stores:
            await s.close()
