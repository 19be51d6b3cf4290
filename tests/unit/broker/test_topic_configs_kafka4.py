"""Topic configs that Kafka 3.x/4.x accept and that mean nothing here (issue 12): accepted
at creation and by both alter APIs, reported by DescribeConfigs; invalid values, and values
that would need behaviour the broker lacks, refused with INVALID_CONFIG saying why."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.handlers import configs
from protocol.codec import request_class
from protocol.errors import ErrorCode
from tests.unit.broker.handlers.admin_support import AdminCaller, admin_caller

DescribeConfigsRequest = request_class(32)
IncrementalAlterConfigsRequest = request_class(44)
_IRes = IncrementalAlterConfigsRequest.AlterConfigsResource
_Cfg = _IRes.AlterableConfig
DYNAMIC, DEFAULT = 1, 5  # config sources

ACCEPTED = {
    "message.format.version": "2.8-IV1",
    "message.downconversion.enable": "false",
    "unclean.leader.election.enable": "true",
    "local.retention.ms": "3600000",
    "local.retention.bytes": "-2",
    "remote.storage.enable": "false",
    "remote.log.copy.disable": "true",
    "min.insync.replicas": "2",
    "preallocate": "true",
    "index.interval.bytes": "8192",
    "flush.messages": "100",
}


@pytest.fixture
async def call(tmp_path: Path) -> AsyncIterator[AdminCaller]:
    async with admin_caller(tmp_path) as caller:
        yield caller


async def _describe(call: AdminCaller, topic: str) -> dict[str, tuple[str, int]]:
    req = DescribeConfigsRequest(
        resources=[
            DescribeConfigsRequest.DescribeConfigsResource(
                resource_type=2, resource_name=topic, configuration_keys=None
            )
        ],
        include_synonyms=False,
    )
    resp = await call(configs.describe_configs, req, 4)
    assert resp.results[0].error_code == 0
    return {c.name: (c.value, c.config_source) for c in resp.results[0].configs}


async def test_accepted_at_creation_and_described(call: AdminCaller) -> None:
    await call.topics.create("t", 1, dict(ACCEPTED))
    described = await _describe(call, "t")
    for name, value in ACCEPTED.items():
        assert described[name] == (value, DYNAMIC), name
    await call.topics.create("plain", 1, {})
    defaults = await _describe(call, "plain")
    assert defaults["message.format.version"] == ("3.0-IV1", DEFAULT)
    assert defaults["local.retention.ms"] == ("-2", DEFAULT)
    assert defaults["remote.storage.enable"] == ("false", DEFAULT)


async def _alter(call: AdminCaller, name: str, value: str) -> tuple[int, str | None]:
    req = IncrementalAlterConfigsRequest(
        resources=[
            _IRes(
                resource_type=2,
                resource_name="t",
                configs=[_Cfg(name=name, config_operation=0, value=value)],
            )
        ],
        validate_only=False,
    )
    resp = await call(configs.incremental_alter_configs, req, 1)
    return resp.responses[0].error_code, resp.responses[0].error_message


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("remote.storage.enable", "true", "tiered storage is not implemented"),
        ("message.format.version", "latest", "Kafka version"),
        ("message.downconversion.enable", "maybe", "true or false"),
        ("local.retention.ms", "-3", "must be in"),
        ("min.insync.replicas", "0", "must be in"),
    ],
)
async def test_refused_with_the_reason(call: AdminCaller, name: str, value: str, why: str) -> None:
    await call.topics.create("t", 1, {})
    code, message = await _alter(call, name, value)
    assert code == ErrorCode.INVALID_CONFIG
    assert message is not None and why in message and name in message


async def test_altered_and_described(call: AdminCaller) -> None:
    await call.topics.create("t", 1, {})
    assert await _alter(call, "message.format.version", "3.4") == (0, None)
    assert await _alter(call, "local.retention.bytes", "1048576") == (0, None)
    described = await _describe(call, "t")
    assert described["message.format.version"] == ("3.4", DYNAMIC)
    assert described["local.retention.bytes"] == ("1048576", DYNAMIC)
