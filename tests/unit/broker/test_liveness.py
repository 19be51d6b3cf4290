"""/healthz's verdict (broker/http.py) and what the lease keep-alive records for it
(broker/cluster.py): a starved loop, and a lease refresh that never returns."""

from __future__ import annotations

import asyncio
from typing import Any

from broker.cluster import Cluster
from broker.config import BrokerConfig
from broker.http import KEEPALIVE_STUCK_S, LIVENESS_DELAY_S, keepalive_problem
from broker.meta.base import MetaStore


def test_verdicts() -> None:
    assert keepalive_problem(0.0, 0.0) == ""
    assert keepalive_problem(LIVENESS_DELAY_S - 0.1, KEEPALIVE_STUCK_S - 1) == ""
    assert "late" in keepalive_problem(LIVENESS_DELAY_S + 0.1, 0.0)
    assert "in flight for 61 s" in keepalive_problem(0.0, KEEPALIVE_STUCK_S + 1)


class HangingRefresh:
    """The embedded store, except that lease refreshes wait until released (as a gRPC
    keep-alive did when its channel was closed under it)."""

    def __init__(self, inner: MetaStore) -> None:
        self.inner = inner
        self.refreshing = asyncio.Event()
        self.release = asyncio.Event()

    async def refresh_lease(self, lease_id: int) -> int:
        self.refreshing.set()
        await self.release.wait()
        return int(await self.inner.refresh_lease(lease_id))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_refresh_in_flight_is_visible_until_it_returns(meta: MetaStore) -> None:
    store = HangingRefresh(meta)
    cluster = Cluster(store, BrokerConfig(lease_ttl_s=1))
    await cluster.start()
    try:
        async with asyncio.timeout(30):
            await store.refreshing.wait()
        assert cluster.refresh_since is not None  # /healthz measures from here
        store.release.set()
        async with asyncio.timeout(30):
            while cluster.refresh_since is not None or not cluster.stats["lease_refreshes"]:
                await asyncio.sleep(0.01)
    finally:
        store.release.set()
        await cluster.stop()


async def test_registering_after_a_long_wait_renews_its_own_lease(meta: MetaStore) -> None:
    """A previous incarnation's key outlives our whole lease TTL: the broker waits for it,
    then registers under a live lease (renewed, or new), not the one that ran out while
    it waited, and its keep-alive goes on refreshing it."""
    from broker.meta.schema import broker_key

    old = await meta.grant_lease(3)  # the previous process's lease: 3 s
    await meta.put(broker_key(0), b'{"host": "127.0.0.1", "port": 1}', old)
    cluster = Cluster(meta, BrokerConfig(lease_ttl_s=1))
    async with asyncio.timeout(30):
        await cluster.start()  # waits ~3 s for the old key: longer than our 1 s TTL
    try:
        kv = await meta.get(broker_key(0))
        assert kv is not None and kv.lease == cluster.lease_id != old
        assert await meta.refresh_lease(cluster.lease_id) > 0  # alive
    finally:
        await cluster.stop()
