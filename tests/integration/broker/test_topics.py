"""TopicManager against the real metadata stores: EmbeddedStore and etcd (a real process)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.meta.base import MetaStore, open_meta
from broker.meta.schema import TopicInfo
from broker.topic_configs import ConfigSource, ResourceType
from broker.topics import TopicManager
from protocol.errors import ErrorCode, KafkaProtocolError
from segments.local_store import LocalStore
from tests.fixtures.etcd import start_etcd

pytestmark = pytest.mark.integration

WAIT = 5.0


@dataclass
class Env:
    meta: MetaStore
    other: MetaStore  # a second client of the same store ("another broker")
    managers: list[TopicManager] = field(default_factory=list)

    async def manager(self, config: BrokerConfig | None = None, **kw: object) -> TopicManager:
        tm = TopicManager(self.meta, config or BrokerConfig(default_partitions=3), **kw)  # type: ignore[arg-type]
        await tm.start()
        self.managers.append(tm)
        return tm

    async def second(self, config: BrokerConfig | None = None) -> TopicManager:
        tm = TopicManager(self.other, config or BrokerConfig(default_partitions=3))
        await tm.start()
        self.managers.append(tm)
        return tm


@pytest.fixture(params=["embedded", "etcd"])
async def env(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Env]:
    prefix = f"/test-{uuid.uuid4().hex[:12]}"
    if request.param == "embedded":
        meta = open_meta("embedded", data_dir=str(tmp_path), prefix=prefix)
        other = meta  # one embedded store per data dir: brokers share the instance
    else:
        url = request.getfixturevalue("etcd_url")
        meta = open_meta(url, prefix=prefix)
        other = open_meta(url, prefix=prefix)
    e = Env(meta, other)
    try:
        yield e
    finally:
        for tm in e.managers:
            await tm.stop()
        await meta.close()
        if other is not meta:
            await other.close()


def _code(exc: pytest.ExceptionInfo[KafkaProtocolError]) -> ErrorCode:
    return exc.value.code


async def _until(tm: TopicManager, cond: Callable[[], bool]) -> None:
    """Wait until ``cond`` holds, re-checking it whenever ``tm``'s cache changes."""
    changed = asyncio.Event()

    def listener(_name: str, _info: TopicInfo | None) -> None:
        changed.set()

    tm.add_listener(listener)
    try:
        async with asyncio.timeout(WAIT):
            while not cond():
                await changed.wait()
                changed.clear()
    finally:
        tm.remove_listener(listener)


# ---------------------------------------------------------------- create


async def test_create_stores_the_documented_json(env: Env) -> None:
    tm = await env.manager()
    info = await tm.create("orders", 4, {"retention.ms": "1000"})
    assert info.partitions == 4 and dict(info.configs) == {"retention.ms": "1000"}
    kv = await env.meta.get("/topics/orders")
    assert kv is not None
    assert json.loads(kv.value) == {
        "id": str(info.topic_id),
        "partitions": 4,
        "configs": {"retention.ms": "1000"},
    }
    assert tm.get("orders") == info
    assert tm.get_by_id(info.topic_id) == info
    assert [t.name for t in tm.all()] == ["orders"]
    with pytest.raises(TypeError):
        info.configs["retention.ms"] = "5"  # type: ignore[index]


async def test_default_partitions_and_validate_only(env: Env) -> None:
    tm = await env.manager(BrokerConfig(default_partitions=7))
    dry = await tm.create("dry", validate_only=True)
    assert dry.partitions == 7
    assert tm.get("dry") is None and await env.meta.get("/topics/dry") is None
    assert (await tm.create("real")).partitions == 7


async def test_duplicate_is_topic_already_exists_even_from_another_broker(env: Env) -> None:
    tm1 = await env.manager()
    tm2 = TopicManager(env.other, BrokerConfig())  # not started: its cache is empty
    first = await tm1.create("dup", 2)
    with pytest.raises(KafkaProtocolError) as exc:
        await tm1.create("dup", 2)
    assert _code(exc) == ErrorCode.TOPIC_ALREADY_EXISTS
    with pytest.raises(KafkaProtocolError) as exc:
        await tm2.create("dup", 5)
    assert _code(exc) == ErrorCode.TOPIC_ALREADY_EXISTS
    kv = await env.meta.get("/topics/dup")
    assert kv is not None and kv.version == 1
    assert TopicInfo.from_json("dup", kv.value) == first


@pytest.mark.parametrize(
    "name", ["", ".", "..", "a" * 250, "has space", "a/b", "ümlaut", "new\nline", "tab\t", "a:b"]
)
async def test_invalid_topic_names(env: Env, name: str) -> None:
    tm = await env.manager()
    with pytest.raises(KafkaProtocolError) as exc:
        await tm.create(name)
    assert _code(exc) == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert await env.meta.range("/topics/") == []


async def test_valid_edge_names_and_dot_underscore_collision(env: Env) -> None:
    tm = await env.manager()
    for name in ["a" * 249, "A.b-c_9", "..."]:
        assert (await tm.create(name, 1)).name == name
    await tm.create("metrics.cpu", 1)
    with pytest.raises(KafkaProtocolError) as exc:
        await tm.create("metrics_cpu", 1)
    assert _code(exc) == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert "collides" in exc.value.message


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"partitions": 0}, ErrorCode.INVALID_PARTITIONS),
        ({"partitions": -2}, ErrorCode.INVALID_PARTITIONS),
        ({"partitions": 10_001}, ErrorCode.INVALID_PARTITIONS),
        ({"replication_factor": 0}, ErrorCode.INVALID_REPLICATION_FACTOR),
        ({"replication_factor": 4}, ErrorCode.INVALID_REPLICATION_FACTOR),
        ({"configs": {"no.such.config": "1"}}, ErrorCode.INVALID_CONFIG),
        ({"configs": {"cleanup.policy": "purge"}}, ErrorCode.INVALID_CONFIG),
        ({"configs": {"cleanup.policy": "delete,purge"}}, ErrorCode.INVALID_CONFIG),
        ({"configs": {"min.cleanable.dirty.ratio": "1.5"}}, ErrorCode.INVALID_CONFIG),
        ({"configs": {"retention.ms": "soon"}}, ErrorCode.INVALID_CONFIG),
        ({"configs": {"retention.ms": "-2"}}, ErrorCode.INVALID_CONFIG),
        ({"configs": {"message.timestamp.type": "WallTime"}}, ErrorCode.INVALID_CONFIG),
        ({"configs": {"compression.type": "brotli"}}, ErrorCode.INVALID_CONFIG),
        ({"configs": {"preallocate": "maybe"}}, ErrorCode.INVALID_CONFIG),
        ({"assignments": {0: [1], 2: [1]}}, ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        ({"assignments": {0: [1, 1]}}, ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        ({"assignments": {0: [1]}, "partitions": 1}, ErrorCode.INVALID_REQUEST),
    ],
)
async def test_invalid_create_arguments(env: Env, kwargs: dict, code: ErrorCode) -> None:
    tm = await env.manager()
    with pytest.raises(KafkaProtocolError) as exc:
        await tm.create("bad", **kwargs)
    assert _code(exc) == code
    assert await env.meta.get("/topics/bad") is None


async def test_unknown_config_message_names_the_key(env: Env) -> None:
    tm = await env.manager()
    with pytest.raises(KafkaProtocolError) as exc:
        await tm.create("t", 1, {"flux.capacitor": "1"})
    assert "flux.capacitor" in exc.value.message


async def test_accepted_configs_are_normalized(env: Env) -> None:
    tm = await env.manager()
    info = await tm.create(
        "norm",
        1,
        {
            "retention.ms": " 0100 ",
            "cleanup.policy": "delete",
            "message.timestamp.type": "LogAppendTime",
            "compression.type": "zstd",
            "preallocate": "TRUE",
            "retention.bytes": None,  # null: the default
        },
        replication_factor=3,
    )
    assert dict(info.configs) == {
        "retention.ms": "100",
        "cleanup.policy": "delete",
        "message.timestamp.type": "LogAppendTime",
        "compression.type": "zstd",
        "preallocate": "true",
    }
    eff = tm.effective_configs(info)
    assert eff["retention.ms"] == "100" and eff["retention.bytes"] == "-1"


async def test_manual_assignments_fix_the_partition_count(env: Env) -> None:
    tm = await env.manager()
    info = await tm.create("assigned", assignments={0: [0], 1: [1, 2], 2: [0]})
    assert info.partitions == 3


# ---------------------------------------------------------------- delete


async def test_delete_removes_metadata_and_objects(env: Env, tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path / "objects"))
    tm = await env.manager(store=store, namespace="ns")
    await tm.create("gone", 2)
    await tm.create("gone2", 1)  # shares a name prefix: must survive
    for key in ["/logs/gone/0/end", "/logs/gone/1/segments/00", "/owners/gone/0"]:
        await env.meta.put(key, b"{}")
    await env.meta.put("/logs/gone2/0/end", b"{}")
    for key in ["ns/gone/0/segment-0.kfs", "ns/gone/1/segment-0.kfs", "ns/gone2/0/s.kfs"]:
        await store.put_if_absent(key, [b"data"])
    old = await tm.delete("gone")
    await tm.wait_background()
    assert old.name == "gone" and tm.get("gone") is None and tm.get_by_id(old.topic_id) is None
    assert await env.meta.get("/topics/gone") is None
    assert await env.meta.range("/logs/gone/") == []
    assert await env.meta.range("/owners/gone/") == []
    assert [kv.key for kv in await env.meta.range("/logs/")] == ["/logs/gone2/0/end"]
    assert [o.key for o in await store.list("ns/")] == ["ns/gone2/0/s.kfs"]
    with pytest.raises(KafkaProtocolError) as exc:
        await tm.delete("gone")
    assert _code(exc) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    again = await tm.create("gone", 1)
    assert again.topic_id != old.topic_id


# ---------------------------------------------------------------- alter


async def test_add_partitions(env: Env) -> None:
    tm = await env.manager()
    info = await tm.create("grow", 2, {"retention.ms": "5"})
    assert (await tm.add_partitions("grow", 5, validate_only=True)).partitions == 5
    assert tm.get("grow") == info
    grown = await tm.add_partitions("grow", 5)
    assert grown.partitions == 5 and grown.topic_id == info.topic_id
    assert dict(grown.configs) == {"retention.ms": "5"}
    assert tm.get("grow") == grown
    for total in (5, 3):
        with pytest.raises(KafkaProtocolError) as exc:
            await tm.add_partitions("grow", total)
        assert _code(exc) == ErrorCode.INVALID_PARTITIONS
    with pytest.raises(KafkaProtocolError) as exc:
        await tm.add_partitions("grow", 7, assignments=[[1]])
    assert _code(exc) == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    with pytest.raises(KafkaProtocolError) as exc:
        await tm.add_partitions("nope", 3)
    assert _code(exc) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_concurrent_alters_from_two_brokers_both_apply(env: Env) -> None:
    tm1 = await env.manager()
    tm2 = await env.second()
    await tm1.create("race", 1)
    await asyncio.gather(
        *(tm1.alter_configs("race", {"retention.ms": str(i)}) for i in range(5)),
        *(tm2.alter_configs("race", {"retention.bytes": str(i)}) for i in range(5)),
        tm2.add_partitions("race", 4),
    )
    kv = await env.meta.get("/topics/race")
    assert kv is not None
    final = TopicInfo.from_json("race", kv.value)
    assert final.partitions == 4
    assert set(final.configs) == {"retention.ms", "retention.bytes"}


async def test_alter_configs_set_delete_replace(env: Env) -> None:
    tm = await env.manager()
    await tm.create("cfg", 1, {"retention.ms": "1", "segment.ms": "2"})
    info = await tm.alter_configs("cfg", {"retention.bytes": "10"}, ["segment.ms"])
    assert dict(info.configs) == {"retention.ms": "1", "retention.bytes": "10"}
    same = await tm.alter_configs("cfg", {"retention.ms": "9"}, validate_only=True)
    assert same.configs["retention.ms"] == "9" and tm.get("cfg") == info
    replaced = await tm.alter_configs("cfg", {"max.message.bytes": "100"}, replace=True)
    assert dict(replaced.configs) == {"max.message.bytes": "100"}
    for bad in ({"cleanup.policy": "purge"}, {"what.ever": "1"}):
        with pytest.raises(KafkaProtocolError) as exc:
            await tm.alter_configs("cfg", bad)
        assert _code(exc) == ErrorCode.INVALID_CONFIG
    assert dict((await tm.delete("cfg")).configs) == {"max.message.bytes": "100"}
    with pytest.raises(KafkaProtocolError) as exc:
        await tm.alter_configs("cfg", {"retention.ms": "1"})
    assert _code(exc) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_incremental_alter(env: Env) -> None:
    tm = await env.manager()
    await tm.create("inc", 1, {"retention.ms": "1"})
    key = "leader.replication.throttled.replicas"
    info = await tm.incremental_alter_configs(
        "inc", [(key, 2, "0:1"), ("retention.ms", 1, None), ("segment.ms", 0, "7")]
    )
    assert dict(info.configs) == {key: "0:1", "segment.ms": "7"}
    info = await tm.incremental_alter_configs("inc", [(key, 2, "1:1,0:1")])
    assert info.configs[key] == "0:1,1:1"
    info = await tm.incremental_alter_configs("inc", [(key, 3, "0:1")])
    assert info.configs[key] == "1:1"
    for ops in (
        [("retention.ms", 2, "5")],  # APPEND on a non-list config
        [("cleanup.policy", 2, "purge")],
        [("bogus.key", 0, "1")],
        [(key, 2, "not-a-replica")],
    ):
        with pytest.raises(KafkaProtocolError) as exc:
            await tm.incremental_alter_configs("inc", ops)
        assert _code(exc) == ErrorCode.INVALID_CONFIG, ops
    assert tm.get("inc") == info


# ---------------------------------------------------------------- describe


async def test_describe_topic_configs(env: Env) -> None:
    tm = await env.manager(BrokerConfig(max_message_bytes=12345))
    await tm.create("desc", 1, {"retention.ms": "42"})
    entries = {e.name: e for e in tm.describe_configs(ResourceType.TOPIC, "desc")}
    assert entries["retention.ms"].value == "42"
    assert entries["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG
    assert not entries["retention.ms"].is_default
    assert entries["max.message.bytes"].value == "12345"
    assert entries["max.message.bytes"].source == ConfigSource.DEFAULT_CONFIG
    assert entries["max.message.bytes"].is_default
    assert entries["cleanup.policy"].value == "delete"
    assert not any(e.read_only for e in entries.values())
    some = tm.describe_configs(ResourceType.TOPIC, "desc", ["retention.ms", "nope"], True, True)
    assert [e.name for e in some] == ["retention.ms"]
    assert [(s.name, s.value, s.source) for s in some[0].synonyms] == [
        ("retention.ms", "42", ConfigSource.DYNAMIC_TOPIC_CONFIG),
        ("log.retention.ms", "604800000", ConfigSource.DEFAULT_CONFIG),
    ]
    assert some[0].documentation
    with pytest.raises(KafkaProtocolError) as exc:
        tm.describe_configs(ResourceType.TOPIC, "missing")
    assert _code(exc) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_compaction_configs(env: Env) -> None:
    tm = await env.manager()
    info = await tm.create(
        "cmp",
        1,
        {"cleanup.policy": "delete, compact", "min.cleanable.dirty.ratio": "0.25",
         "min.compaction.lag.ms": "5", "max.compaction.lag.ms": "60000",
         "delete.retention.ms": "100", "segment.ms": "1000"},
    )  # fmt: skip
    assert info.configs["cleanup.policy"] == "compact,delete"
    entries = {e.name: e for e in tm.describe_configs(ResourceType.TOPIC, "cmp")}
    for name, value in (("min.cleanable.dirty.ratio", "0.25"), ("delete.retention.ms", "100")):
        assert entries[name].value == value
        assert entries[name].source == ConfigSource.DYNAMIC_TOPIC_CONFIG
    await tm.create("cmp2", 1)
    entries = {e.name: e for e in tm.describe_configs(ResourceType.TOPIC, "cmp2", None, True)}
    defaults = {
        "min.cleanable.dirty.ratio": ("0.5", "log.cleaner.min.cleanable.ratio"),
        "min.compaction.lag.ms": ("0", "log.cleaner.min.compaction.lag.ms"),
        "max.compaction.lag.ms": (str(2**63 - 1), "log.cleaner.max.compaction.lag.ms"),
        "delete.retention.ms": ("86400000", "log.cleaner.delete.retention.ms"),
    }
    for name, (value, synonym) in defaults.items():
        e = entries[name]
        assert (e.value, e.source, e.is_default) == (value, ConfigSource.DEFAULT_CONFIG, True)
        assert [s.name for s in e.synonyms] == [synonym]
    info = await tm.incremental_alter_configs("cmp2", [("cleanup.policy", 2, "compact")])
    assert info.configs["cleanup.policy"] == "compact,delete"
    info = await tm.incremental_alter_configs("cmp2", [("cleanup.policy", 3, "delete")])
    assert info.configs["cleanup.policy"] == "compact"
    info = await tm.alter_configs("cmp2", {"cleanup.policy": "delete"})
    assert info.configs["cleanup.policy"] == "delete"
    # Kafka's rule across configs: min.compaction.lag.ms <= max.compaction.lag.ms
    with pytest.raises(KafkaProtocolError) as exc:
        await tm.create("cmp3", 1, {"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"})
    assert _code(exc) == ErrorCode.INVALID_CONFIG
    await tm.alter_configs("cmp2", {"max.compaction.lag.ms": "5"})
    with pytest.raises(KafkaProtocolError) as exc:
        await tm.alter_configs("cmp2", {"min.compaction.lag.ms": "6"})
    assert _code(exc) == ErrorCode.INVALID_CONFIG and "max.compaction.lag.ms" in exc.value.message


async def test_describe_broker_configs(env: Env) -> None:
    config = BrokerConfig(node_id=7, default_partitions=5, auto_create_topics=False)
    tm = await env.manager(config)
    entries = {e.name: e for e in tm.describe_configs(ResourceType.BROKER, "7")}
    assert entries["broker.id"].value == "7"
    assert entries["num.partitions"].value == "5"
    assert entries["auto.create.topics.enable"].value == "false"
    assert entries["log.retention.ms"].value == "604800000"
    assert all(
        e.read_only and e.source == ConfigSource.STATIC_BROKER_CONFIG for e in entries.values()
    )
    assert tm.describe_configs(ResourceType.BROKER, "", ["broker.id"])[0].value == "7"
    for rtype, name in ((ResourceType.BROKER, "8"), (ResourceType.BROKER_LOGGER, "7"), (3, "g")):
        with pytest.raises(KafkaProtocolError) as exc:
            tm.describe_configs(rtype, name)
        assert _code(exc) == ErrorCode.INVALID_REQUEST


# ---------------------------------------------------------------- watch and ensure


async def test_watch_propagates_between_brokers(env: Env) -> None:
    tm1 = await env.manager()
    await tm1.create("before", 1)
    tm2 = await env.second()
    seen: list[tuple[str, TopicInfo | None]] = []
    tm2.add_listener(lambda name, info: seen.append((name, info)))
    assert tm2.get("before") == tm1.get("before")

    created = await tm1.create("live", 2)
    await _until(tm2, lambda: tm2.get("live") is not None)
    assert tm2.get("live") == created and tm2.get_by_id(created.topic_id) == created
    altered = await tm1.alter_configs("live", {"retention.ms": "3"})
    await _until(tm2, lambda: tm2.get("live") == altered)
    grown = await tm2.add_partitions("live", 4)
    await _until(tm1, lambda: tm1.get("live") == grown)
    await tm1.delete("live")
    await _until(tm2, lambda: tm2.get("live") is None)
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
        await _until(watcher, lambda: watcher.get("before") is not None)
        etcd.stop()
        etcd = start_etcd(tmp_path, etcd.client_port, etcd.peer_port)
        after = await writer.create("after", 2)
        await writer.delete("before")
        await _until(watcher, lambda: watcher.get("after") == after and not watcher.get("before"))
    finally:
        await watcher.stop()
        for m in metas:
            await m.close()
        etcd.stop()
