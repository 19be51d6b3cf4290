"""EtcdStore behaviour beyond the shared contract: URLs, outages and restarts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.meta.base import MetaStoreError, open_meta
from broker.meta.etcd import EtcdStore
from tests.fixtures.etcd import free_port, start_etcd
from tests.unit.broker.meta.test_contract import closing


def test_from_url_parses_endpoints() -> None:
    store = EtcdStore.from_url("etcd://10.0.0.1:2379,etcd-1.etcd:2380/", prefix="/p")
    assert store._endpoints == [("10.0.0.1", 2379), ("etcd-1.etcd", 2380)]
    with pytest.raises(ValueError):
        EtcdStore.from_url("etcd://nohost")
    assert isinstance(open_meta("etcd://127.0.0.1:1"), EtcdStore)


async def test_unreachable_etcd_raises_meta_store_error() -> None:
    store = EtcdStore([("127.0.0.1", free_port())], prefix="/x", timeout=2.0)
    try:
        with pytest.raises(MetaStoreError):
            await store.get("/k")
        with pytest.raises(MetaStoreError):
            await store.put("/k", b"v")
    finally:
        await store.close()


@pytest.mark.integration
async def test_store_keeps_working_across_an_etcd_restart(tmp_path: Path) -> None:
    etcd = start_etcd(tmp_path)
    store = EtcdStore.from_url(etcd.url, prefix="/restart")
    try:
        rev = await store.put("/a", b"1")
        watch = store.watch("/", start_revision=rev)
        first = await anext(watch)
        assert first.key == "/a"
        etcd.stop()
        # the open watch ends with an error; calls fail with MetaStoreError, not gRPC errors
        with pytest.raises(MetaStoreError):
            async with asyncio.timeout(10):
                await anext(watch)
        with pytest.raises(MetaStoreError):
            await store.get("/a")
        etcd = start_etcd(tmp_path, etcd.client_port, etcd.peer_port)
        kv = await store.get("/a")
        assert kv is not None and kv.value == b"1"
        assert await store.put("/b", b"2") > rev

        # a write as the first call after an outage (no failed call in between) works too
        etcd.stop()
        etcd = start_etcd(tmp_path, etcd.client_port, etcd.peer_port)
        assert await store.put("/c", b"3") > rev
        watch2 = store.watch("/", start_revision=rev)
        async with closing(watch2):
            keys = [(await anext(watch2)).key for _ in range(3)]
        assert keys == ["/a", "/b", "/c"]
    finally:
        await store.close()
        etcd.stop()
