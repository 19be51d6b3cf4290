"""TopicManager's cache against the real metadata stores: EmbeddedStore and etcd (a real
process): changes propagate between brokers by the watch, start loads what exists,
ensure (auto-create) creates once, and the watch resyncs after an etcd restart."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.meta.base import open_meta
from broker.meta.schema import TopicInfo
from broker.topics import TopicManager
from tests.fixtures.etcd import start_etcd
from tests.integration.broker.topic_env import Env, until

pytestmark = pytest.mark.integration


async def test_watch_propagates_between_brokers(env: Env) -> None:
    tm1 = await env.manager()
    await tm1.create("before", 1)
    tm2 = await env.second()
    seen: list[tuple[str, TopicInfo | None]] = []
    tm2.add_listener(lambda name, info: seen.append((name, info)))
    assert tm2.get("before") == tm1.get("before")

    created = await tm1.create("live", 2)
    await until(tm2, lambda: tm2.get("live") is not None)
    assert tm2.get("live") == created and tm2.get_by_id(created.topic_id) == created
    altered = await tm1.alter_configs("live", {"retention.ms": "3"})
    await until(tm2, lambda: tm2.get("live") == altered)
    grown = await tm2.add_partitions("live", 4)
    await until(tm1, lambda: tm1.get("live") == grown)
    await tm1.delete("live")
    await until(tm2, lambda: tm2.get("live") is None)
    assert tm2.get_by_id(created.topic_id) is None
    assert [(n, i) for n, i in seen if n == "live"] == [
        ("live", created),
        ("live", altered),
        ("live", grown),
        ("live", None),
    ]


async def test_start_loads_existing_topics_and_tells_listeners(env: Env) -> None:
    tm1 = await env.manager()
    a = await tm1.create("a", 1)
    b = await tm1.create("b", 2)
    tm2 = TopicManager(env.other, BrokerConfig())
    seen: dict[str, TopicInfo | None] = {}
    tm2.add_listener(lambda name, info: seen.__setitem__(name, info))
    await tm2.start()
    env.managers.append(tm2)
    assert seen == {"a": a, "b": b}
    assert tm2.all() == [a, b]


async def test_concurrent_ensure_creates_once(env: Env) -> None:
    tm1 = await env.manager()
    tm2 = await env.second()
    results = await asyncio.gather(*(tm.ensure("auto") for _ in range(25) for tm in (tm1, tm2)))
    ids = {r.topic_id for r in results if r is not None}
    assert len(ids) == 1 and all(r is not None and r.partitions == 3 for r in results)
    kv = await env.meta.get("/topics/auto")
    assert kv is not None and kv.version == 1
    assert await tm1.ensure("bad name") is None
    assert await env.meta.get("/topics/bad name") is None


async def test_ensure_without_auto_create(env: Env) -> None:
    tm = await env.manager(BrokerConfig(auto_create_topics=False))
    assert await tm.ensure("nope") is None
    assert await env.meta.get("/topics/nope") is None
    made = await tm.create("made", 1)
    assert await tm.ensure("made") == made


async def test_watch_resyncs_after_an_etcd_restart(tmp_path: Path) -> None:
    etcd = start_etcd(tmp_path)
    metas = [open_meta(etcd.url), open_meta(etcd.url)]
    writer = TopicManager(metas[0], BrokerConfig())  # not started: only writes
    watcher = TopicManager(metas[1], BrokerConfig())
    try:
        await watcher.start()
        await writer.create("before", 1)
        await until(watcher, lambda: watcher.get("before") is not None)
        etcd.stop()
        etcd = start_etcd(tmp_path, etcd.client_port, etcd.peer_port)
        after = await writer.create("after", 2)
        await writer.delete("before")
        await until(watcher, lambda: watcher.get("after") == after and not watcher.get("before"))
    finally:
        await watcher.stop()
        for m in metas:
            await m.close()
        etcd.stop()
