"""TopicManager create and delete against the real metadata stores: EmbeddedStore and etcd
(a real process): the stored JSON, names, arguments and configs, deletion of metadata and
objects."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.compaction_policy import compaction_of
from broker.config import BrokerConfig
from broker.maintenance_policy import retention_of
from broker.meta.schema import TopicInfo
from broker.topics import TopicManager
from protocol.errors import ErrorCode, KafkaProtocolError
from segments.local_store import LocalStore
from tests.integration.broker.topic_env import Env, code_of

pytestmark = pytest.mark.integration


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
    assert code_of(exc) == ErrorCode.TOPIC_ALREADY_EXISTS
    with pytest.raises(KafkaProtocolError) as exc:
        await tm2.create("dup", 5)
    assert code_of(exc) == ErrorCode.TOPIC_ALREADY_EXISTS
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
    assert code_of(exc) == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert await env.meta.range("/topics/") == []


async def test_valid_edge_names_and_dot_underscore_collision(env: Env) -> None:
    tm = await env.manager()
    for name in ["a" * 249, "A.b-c_9", "..."]:
        assert (await tm.create(name, 1)).name == name
    await tm.create("metrics.cpu", 1)
    with pytest.raises(KafkaProtocolError) as exc:
        await tm.create("metrics_cpu", 1)
    assert code_of(exc) == ErrorCode.INVALID_TOPIC_EXCEPTION
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
    assert code_of(exc) == code
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
    assert code_of(exc) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    again = await tm.create("gone", 1)
    assert again.topic_id != old.topic_id


async def test_the_produce_policy_follows_every_change_of_the_topic(env: Env) -> None:
    tm = await env.manager()
    info = await tm.create("pol", 1)
    first = tm.produce_policy(info)
    assert first.max_bytes == int(tm.effective_configs(info)["max.message.bytes"]) != 1000
    assert not first.compacted and not first.timestamps.log_append_time
    assert tm.produce_policy(info) is first  # derived once per version of the topic
    changed = await tm.alter_configs(
        "pol",
        {
            "max.message.bytes": "1000",
            "cleanup.policy": "compact",
            "message.timestamp.type": "LogAppendTime",
        },
    )
    now = tm.produce_policy(changed)
    assert (now.max_bytes, now.compacted, now.timestamps.log_append_time) == (1000, True, True)


async def test_maintenance_settings_follow_every_change_of_the_topic(env: Env) -> None:
    """Compaction and retention settings are derived once per version of the topic (the
    maintenance pass asks for them per partition), and an altered topic gets new ones."""
    tm = await env.manager()
    info = await tm.create("maint", 1, configs={"retention.ms": "60000"})
    assert tm.derived(info, compaction_of) is None  # cleanup.policy delete
    limits = tm.derived(info, retention_of)
    assert limits == (60000, int(tm.effective_configs(info)["retention.bytes"]))
    assert tm.derived(info, retention_of) is limits
    changed = await tm.alter_configs(
        "maint", {"cleanup.policy": "compact", "min.compaction.lag.ms": "5"}
    )
    assert tm.derived(changed, retention_of) is None  # compact only: retention deletes nothing
    cfg = tm.derived(changed, compaction_of)
    assert cfg is not None and cfg.compact and cfg.min_lag_ms == 5
    both = await tm.alter_configs("maint", {"cleanup.policy": "compact,delete"})
    assert tm.derived(both, retention_of) is not None and tm.derived(both, compaction_of)
