"""TopicManager alter and describe against the real metadata stores: EmbeddedStore and
etcd (a real process): partitions added, configs set, deleted and altered incrementally
(from two brokers at once), topic, compaction and broker configs described."""

from __future__ import annotations

import asyncio

import pytest

from broker.config import BrokerConfig
from broker.meta.schema import TopicInfo
from broker.topic_configs import ConfigSource, ResourceType
from protocol.errors import ErrorCode, KafkaProtocolError
from tests.integration.broker.topic_env import Env, code_of

pytestmark = pytest.mark.integration


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
        assert code_of(exc) == ErrorCode.INVALID_PARTITIONS
    with pytest.raises(KafkaProtocolError) as exc:
        await tm.add_partitions("grow", 7, assignments=[[1]])
    assert code_of(exc) == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    with pytest.raises(KafkaProtocolError) as exc:
        await tm.add_partitions("nope", 3)
    assert code_of(exc) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


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
        assert code_of(exc) == ErrorCode.INVALID_CONFIG
    assert dict((await tm.delete("cfg")).configs) == {"max.message.bytes": "100"}
    with pytest.raises(KafkaProtocolError) as exc:
        await tm.alter_configs("cfg", {"retention.ms": "1"})
    assert code_of(exc) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


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
        assert code_of(exc) == ErrorCode.INVALID_CONFIG, ops
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
    assert code_of(exc) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


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
    assert code_of(exc) == ErrorCode.INVALID_CONFIG
    await tm.alter_configs("cmp2", {"max.compaction.lag.ms": "5"})
    with pytest.raises(KafkaProtocolError) as exc:
        await tm.alter_configs("cmp2", {"min.compaction.lag.ms": "6"})
    assert code_of(exc) == ErrorCode.INVALID_CONFIG and "max.compaction.lag.ms" in exc.value.message


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
        assert code_of(exc) == ErrorCode.INVALID_REQUEST
