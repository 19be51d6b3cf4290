"""EtcdStore behaviour beyond the shared contract, without an etcd process: URLs and an
unreachable endpoint (restarts: tests/integration/broker/meta/test_etcd_restart.py)."""

from __future__ import annotations

import pytest

from broker.meta.base import MetaStoreError, open_meta
from broker.meta.etcd import EtcdStore
from tests.fixtures.etcd import free_port


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
