"""CreateTopics / DeleteTopics / CreatePartitions handlers, through the real codec."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from broker.handlers import topics_admin
from protocol.codec import request_class
from protocol.errors import ErrorCode
from tests.unit.broker.handlers.admin_support import AdminCaller, admin_caller

CreateTopicsRequest = request_class(19)
DeleteTopicsRequest = request_class(20)
CreatePartitionsRequest = request_class(37)
_Topic = CreateTopicsRequest.CreatableTopic
_Config = _Topic.CreatableTopicConfig
_Assign = _Topic.CreatableReplicaAssignment
_PTopic = CreatePartitionsRequest.CreatePartitionsTopic
_PAssign = _PTopic.CreatePartitionsAssignment


@pytest.fixture
async def call(tmp_path: Path) -> AsyncIterator[AdminCaller]:
    async with admin_caller(tmp_path) as caller:
        yield caller


def _topic(name: str, partitions: int = -1, rf: int = -1, **configs: str) -> Any:
    return _Topic(
        name=name,
        num_partitions=partitions,
        replication_factor=rf,
        assignments=[],
        configs=[_Config(name=k.replace("_", "."), value=v) for k, v in configs.items()],
    )


def _create(*topics: Any, validate_only: bool = False) -> Any:
    return CreateTopicsRequest(topics=list(topics), timeout_ms=1000, validate_only=validate_only)


@pytest.mark.parametrize("version", [0, 1, 2, 4, 5, 7])
async def test_create_topics_per_topic_results(call: AdminCaller, version: int) -> None:
    req = _create(
        _topic("ok", 3, retention_ms="10"),
        _topic("bad name"),
        _topic("zero", 0),
        _topic("rf", 1, 5),
        _topic("cfg", 1, compression_type="brotli"),
        _topic("twice"),
        _topic("twice"),
    )
    resp = await call(topics_admin.create_topics, req, version)
    codes = {t.name: t.error_code for t in resp.topics}
    assert [t.name for t in resp.topics] == [
        "ok",
        "bad name",
        "zero",
        "rf",
        "cfg",
        "twice",
        "twice",
    ]
    assert codes == {
        "ok": 0,
        "bad name": ErrorCode.INVALID_TOPIC_EXCEPTION,
        "zero": ErrorCode.INVALID_PARTITIONS,
        "rf": ErrorCode.INVALID_REPLICATION_FACTOR,
        "cfg": ErrorCode.INVALID_CONFIG,
        "twice": ErrorCode.INVALID_REQUEST,
    }
    info = call.topics.get("ok")
    assert (
        info is not None and info.partitions == 3 and dict(info.configs) == {"retention.ms": "10"}
    )
    assert [t.name for t in call.topics.all()] == ["ok"]
    ok = resp.topics[0]
    if version >= 1:
        assert ok.error_message is None
        assert "compression.type" in resp.topics[4].error_message
    if version >= 5:
        assert ok.num_partitions == 3 and ok.replication_factor == 1
        configs = {c.name: c for c in ok.configs}
        assert configs["retention.ms"].value == "10" and configs["retention.ms"].config_source == 1
        assert configs["retention.bytes"].config_source == 5
        assert resp.topics[1].configs is None and resp.topics[1].num_partitions == -1
    if version >= 7:
        assert ok.topic_id == info.topic_id


async def test_create_topics_defaults_validate_only_and_existing(call: AdminCaller) -> None:
    resp = await call(topics_admin.create_topics, _create(_topic("dry"), validate_only=True), 7)
    assert resp.topics[0].error_code == 0 and resp.topics[0].num_partitions == 2
    assert call.topics.get("dry") is None
    resp = await call(topics_admin.create_topics, _create(_topic("t", -1, 3)), 7)
    assert resp.topics[0].error_code == 0 and call.topics.get("t") is not None
    resp = await call(topics_admin.create_topics, _create(_topic("t")), 7)
    assert resp.topics[0].error_code == ErrorCode.TOPIC_ALREADY_EXISTS


async def test_create_topics_with_assignments(call: AdminCaller) -> None:
    topic = _topic("assigned")
    topic.assignments = [_Assign(partition_index=i, broker_ids=[1]) for i in range(4)]
    resp = await call(topics_admin.create_topics, _create(topic), 4)
    assert resp.topics[0].error_code == 0
    info = call.topics.get("assigned")
    assert info is not None and info.partitions == 4


@pytest.mark.parametrize("version", [0, 1, 3, 5])
async def test_delete_topics_by_name(call: AdminCaller, version: int) -> None:
    await call.topics.create("a", 1)
    req = DeleteTopicsRequest(topic_names=["a", "missing", "bad name"], timeout_ms=1000)
    resp = await call(topics_admin.delete_topics, req, version)
    assert [(r.name, r.error_code) for r in resp.responses] == [
        ("a", 0),
        ("missing", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        ("bad name", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    ]
    assert call.topics.get("a") is None
    if version >= 5:
        assert resp.responses[0].error_message is None and resp.responses[1].error_message


async def test_delete_topics_v6_by_id_and_name(call: AdminCaller) -> None:
    a = await call.topics.create("a", 1)
    await call.topics.create("b", 1)
    state = DeleteTopicsRequest.DeleteTopicState
    zero = uuid.UUID(int=0)
    req = DeleteTopicsRequest(
        topics=[
            state(name=None, topic_id=a.topic_id),
            state(name="b", topic_id=zero),
            state(name=None, topic_id=uuid.uuid4()),
        ],
        timeout_ms=1000,
    )
    resp = await call(topics_admin.delete_topics, req, 6)
    assert [(r.name, r.topic_id, r.error_code) for r in resp.responses][:2] == [
        ("a", a.topic_id, 0),
        ("b", resp.responses[1].topic_id, 0),
    ]
    assert resp.responses[2].error_code == ErrorCode.UNKNOWN_TOPIC_ID
    assert call.topics.all() == []


@pytest.mark.parametrize("version", [0, 1, 2, 3])
async def test_create_partitions(call: AdminCaller, version: int) -> None:
    await call.topics.create("p", 2)
    req = CreatePartitionsRequest(
        topics=[
            _PTopic(name="p", count=5, assignments=None),
            _PTopic(name="missing", count=5, assignments=None),
            _PTopic(name="p2", count=1, assignments=None),
        ],
        timeout_ms=1000,
        validate_only=False,
    )
    await call.topics.create("p2", 3)
    resp = await call(topics_admin.create_partitions, req, version)
    assert [(r.name, r.error_code) for r in resp.results] == [
        ("p", 0),
        ("missing", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        ("p2", ErrorCode.INVALID_PARTITIONS),
    ]
    assert resp.results[0].error_message is None and resp.results[2].error_message
    info = call.topics.get("p")
    assert info is not None and info.partitions == 5


async def test_create_partitions_validate_only_and_assignments(call: AdminCaller) -> None:
    await call.topics.create("p", 1)
    req = CreatePartitionsRequest(
        topics=[_PTopic(name="p", count=3, assignments=[_PAssign(broker_ids=[1])])],
        timeout_ms=1000,
        validate_only=True,
    )
    resp = await call(topics_admin.create_partitions, req, 3)
    assert resp.results[0].error_code == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    req.topics[0].assignments = [_PAssign(broker_ids=[1]), _PAssign(broker_ids=[2])]
    resp = await call(topics_admin.create_partitions, req, 3)
    assert resp.results[0].error_code == 0
    info = call.topics.get("p")
    assert info is not None and info.partitions == 1
