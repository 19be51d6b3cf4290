"""DescribeConfigs / AlterConfigs / IncrementalAlterConfigs handlers, through the real codec."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from broker.handlers import configs
from protocol.codec import request_class
from protocol.errors import ErrorCode
from tests.unit.broker.handlers.admin_support import AdminCaller, admin_caller

DescribeConfigsRequest = request_class(32)
AlterConfigsRequest = request_class(33)
IncrementalAlterConfigsRequest = request_class(44)
_DRes = DescribeConfigsRequest.DescribeConfigsResource
_ARes = AlterConfigsRequest.AlterConfigsResource
_IRes = IncrementalAlterConfigsRequest.AlterConfigsResource

TOPIC, BROKER = 2, 4


@pytest.fixture
async def call(tmp_path: Path) -> AsyncIterator[AdminCaller]:
    async with admin_caller(tmp_path) as caller:
        await caller.topics.create("t", 1, {"retention.ms": "1000"})
        yield caller


def _describe(*resources: tuple[int, str, list[str] | None], **kw: bool) -> Any:
    return DescribeConfigsRequest(
        resources=[
            _DRes(resource_type=t, resource_name=n, configuration_keys=k) for t, n, k in resources
        ],
        include_synonyms=kw.get("synonyms", False),
        include_documentation=kw.get("docs", False),
    )


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
async def test_describe_configs(call: AdminCaller, version: int) -> None:
    req = _describe(
        (TOPIC, "t", None),
        (TOPIC, "missing", None),
        (BROKER, "1", ["broker.id", "num.partitions"]),
        (BROKER, "9", None),
        (8, "1", None),
        synonyms=True,
        docs=True,
    )
    resp = await call(configs.describe_configs, req, version)
    codes = [(r.resource_type, r.resource_name, r.error_code) for r in resp.results]
    assert codes == [
        (TOPIC, "t", 0),
        (TOPIC, "missing", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        (BROKER, "1", 0),
        (BROKER, "9", ErrorCode.INVALID_REQUEST),
        (8, "1", ErrorCode.INVALID_REQUEST),
    ]
    topic = {c.name: c for c in resp.results[0].configs}
    assert topic["retention.ms"].value == "1000" and not topic["retention.ms"].read_only
    assert topic["cleanup.policy"].value == "delete"
    broker = {c.name: c.value for c in resp.results[2].configs}
    assert broker == {"broker.id": "1", "num.partitions": "2"}
    assert all(c.read_only for c in resp.results[2].configs)
    assert resp.results[1].error_message and resp.results[1].configs == []
    if version == 0:
        assert not topic["retention.ms"].is_default and topic["retention.bytes"].is_default
    else:
        assert topic["retention.ms"].config_source == 1
        assert topic["retention.bytes"].config_source == 5
        assert [s.source for s in topic["retention.ms"].synonyms] == [1, 5]
    if version >= 3:
        assert topic["retention.ms"].config_type == 5  # LONG
        assert topic["cleanup.policy"].config_type == 7  # LIST
        assert topic["retention.ms"].documentation


async def test_describe_without_synonyms_or_docs(call: AdminCaller) -> None:
    resp = await call(configs.describe_configs, _describe((TOPIC, "t", ["retention.ms"])), 4)
    (entry,) = resp.results[0].configs
    assert entry.synonyms == [] and entry.documentation is None


def _alter(*resources: tuple[int, str, dict[str, str | None]], validate_only: bool = False) -> Any:
    return AlterConfigsRequest(
        resources=[
            _ARes(
                resource_type=t,
                resource_name=n,
                configs=[_ARes.AlterableConfig(name=k, value=v) for k, v in c.items()],
            )
            for t, n, c in resources
        ],
        validate_only=validate_only,
    )


@pytest.mark.parametrize("version", [0, 1, 2])
async def test_alter_configs_replaces_the_set(call: AdminCaller, version: int) -> None:
    await call.topics.create("u", 1)
    req = _alter(
        (TOPIC, "t", {"retention.bytes": "5"}),
        (TOPIC, "u", {"cleanup.policy": "purge"}),
        (TOPIC, "missing", {"retention.ms": "1"}),
        (BROKER, "1", {"num.partitions": "3"}),
        (TOPIC, "u", {}),
    )
    resp = await call(configs.alter_configs, req, version)
    assert [(r.resource_name, r.error_code) for r in resp.responses] == [
        ("t", 0),
        ("u", ErrorCode.INVALID_CONFIG),
        ("missing", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        ("1", ErrorCode.INVALID_REQUEST),
        ("u", 0),
    ]
    assert "cleanup.policy" in resp.responses[1].error_message
    info = call.topics.get("t")
    assert info is not None and dict(info.configs) == {"retention.bytes": "5"}


async def test_alter_configs_validate_only_and_duplicates(call: AdminCaller) -> None:
    req = _alter((TOPIC, "t", {"retention.ms": "7"}), validate_only=True)
    resp = await call(configs.alter_configs, req, 2)
    assert resp.responses[0].error_code == 0
    info = call.topics.get("t")
    assert info is not None and dict(info.configs) == {"retention.ms": "1000"}
    req = _alter((TOPIC, "t", {"retention.ms": "7"}))
    req.resources[0].configs.append(_ARes.AlterableConfig(name="retention.ms", value="8"))
    resp = await call(configs.alter_configs, req, 2)
    assert resp.responses[0].error_code == ErrorCode.INVALID_REQUEST


def _incremental(name: str, *ops: tuple[str, int, str | None], rtype: int = TOPIC) -> Any:
    cfg = _IRes.AlterableConfig
    return IncrementalAlterConfigsRequest(
        resources=[
            _IRes(
                resource_type=rtype,
                resource_name=name,
                configs=[cfg(name=k, config_operation=op, value=v) for k, op, v in ops],
            )
        ],
        validate_only=False,
    )


@pytest.mark.parametrize("version", [0, 1])
async def test_incremental_alter_configs(call: AdminCaller, version: int) -> None:
    key = "follower.replication.throttled.replicas"
    req = _incremental("t", ("segment.ms", 0, "9"), ("retention.ms", 1, None), (key, 2, "0:1"))
    resp = await call(configs.incremental_alter_configs, req, version)
    assert resp.responses[0].error_code == 0
    info = call.topics.get("t")
    assert info is not None and dict(info.configs) == {"segment.ms": "9", key: "0:1"}
    for ops, code in (
        ([("segment.ms", 2, "1")], ErrorCode.INVALID_CONFIG),
        ([("cleanup.policy", 2, "purge")], ErrorCode.INVALID_CONFIG),
        ([("x.y", 0, "1")], ErrorCode.INVALID_CONFIG),
        ([(key, 3, "0:1"), (key, 2, "1:1")], ErrorCode.INVALID_REQUEST),
    ):
        resp = await call(configs.incremental_alter_configs, _incremental("t", *ops), version)
        assert resp.responses[0].error_code == code, ops
    resp = await call(configs.incremental_alter_configs, _incremental("t", (key, 3, "0:1")), 1)
    assert resp.responses[0].error_code == 0
    info = call.topics.get("t")
    assert info is not None and info.configs[key] == ""
    resp = await call(
        configs.incremental_alter_configs, _incremental("1", ("x", 0, "1"), rtype=BROKER), 1
    )
    assert resp.responses[0].error_code == ErrorCode.INVALID_REQUEST
