"""EtcdStore across restarts of a real etcd process."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.meta.base import MetaStoreError
from broker.meta.etcd import EtcdStore
from tests.fixtures.etcd import start_etcd
from tests.unit.broker.meta.test_contract import closing

pytestmark = pytest.mark.integration


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
