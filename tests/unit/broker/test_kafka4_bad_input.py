"""Odd input to the Kafka 4 admin APIs (issue 12) on an in-process broker: each gets
Kafka's error for the part that is wrong, never UNKNOWN_SERVER_ERROR, and the connection
stays usable."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from kafka.protocol.admin import (
    AlterClientQuotasRequest,
    DescribeClientQuotasRequest,
    DescribeTopicPartitionsRequest,
    ElectLeadersRequest,
    UpdateFeaturesRequest,
)

from broker.config import BrokerConfig
from broker.handlers.log_dirs import log_dir_name
from broker.server import Broker
from protocol.errors import ErrorCode
from tests.fixtures.inprocess import local_config
from tests.unit.broker.wire_client import WireClient


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[WireClient]:
    b = Broker(local_config(tmp_path))
    await b.start()
    await b.topics.create("t", 3)
    c = await WireClient.connect(b.port)
    try:
        yield c
    finally:
        await c.close()
        await b.stop()


async def test_quota_values_and_filters(client: WireClient) -> None:
    e = AlterClientQuotasRequest.EntryData
    entries = [
        e(
            entity=[e.EntityData(entity_type="client-id", entity_name="c")],
            ops=[e.OpData(key="producer_byte_rate", value=v, remove=False)],
        )
        for v in (float("nan"), float("-inf"), 0.0, 1e30)
    ]
    entries.append(e(entity=[], ops=[e.OpData(key="producer_byte_rate", value=1.0, remove=False)]))
    resp = await client.call(AlterClientQuotasRequest(entries=entries, validate_only=False), 1)
    assert [x.error_code for x in resp.entries] == [ErrorCode.INVALID_REQUEST] * 5
    comp = DescribeClientQuotasRequest.ComponentData
    bad = DescribeClientQuotasRequest(
        components=[comp(entity_type="user", match_type=7, match=None)], strict=False
    )
    assert (await client.call(bad, 1)).error_code == ErrorCode.INVALID_REQUEST


async def test_describe_topic_partitions_odd_cursors(client: WireClient) -> None:
    r = DescribeTopicPartitionsRequest
    for cursor, limit in ((r.Cursor(topic_name="t", partition_index=-5), -1),
                          (r.Cursor(topic_name="t", partition_index=99), 0),
                          (r.Cursor(topic_name="zzz", partition_index=0), 5)):  # fmt: skip
        req = r(topics=[r.TopicRequest(name="t")], response_partition_limit=limit, cursor=cursor)
        resp = await client.call(req, 0)
        for t in resp.topics:
            assert t.error_code in (0, ErrorCode.INVALID_REQUEST)
    # every page of one partition at a time: all three, then no cursor
    seen, cursor = [], None
    for _ in range(5):
        req = r(topics=[], response_partition_limit=1, cursor=cursor)
        resp = await client.call(req, 0)
        seen += [p.partition_index for t in resp.topics for p in t.partitions]
        cursor = resp.next_cursor
        if cursor is None:
            break
    assert seen == [0, 1, 2] and cursor is None


async def test_elect_leaders_unknown_partitions(client: WireClient) -> None:
    tp = ElectLeadersRequest.TopicPartitions
    req = ElectLeadersRequest(
        election_type=1,
        topic_partitions=[tp(topic="t", partitions=[0, 7, -1]), tp(topic="nope", partitions=[0])],
        timeout_ms=1000,
    )
    resp = await client.call(req, 2)
    codes = {
        (r.topic, p.partition_id): p.error_code
        for r in resp.replica_election_results
        for p in r.partition_result
    }
    assert codes[("t", 0)] == 0  # taken now by this broker (its only owner)
    assert codes[("t", 7)] == codes[("t", -1)] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert codes[("nope", 0)] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    again = await client.call(req, 2)
    first = [p.error_code for r in again.replica_election_results if r.topic == "t"
             for p in r.partition_result if p.partition_id == 0]  # fmt: skip
    assert first == [ErrorCode.ELECTION_NOT_NEEDED]


async def test_update_features_per_feature_before_v2(client: WireClient) -> None:
    key = UpdateFeaturesRequest.FeatureUpdateKey
    req = UpdateFeaturesRequest(
        timeout_ms=1000,
        feature_updates=[
            key(feature="metadata.version", max_version_level=25, upgrade_type=1),
            key(feature="no.such.feature", max_version_level=1, upgrade_type=1),
        ],
        validate_only=False,
    )
    resp = await client.call(req, 1)
    assert resp.error_code == 0
    assert [(r.feature, r.error_code) for r in resp.results] == [
        ("metadata.version", 0),
        ("no.such.feature", ErrorCode.INVALID_UPDATE_VERSION),
    ]
    v2 = await client.call(req, 2)
    assert v2.error_code == ErrorCode.INVALID_UPDATE_VERSION and "no.such" in v2.error_message


def test_log_dir_name_carries_no_credentials() -> None:
    s3 = "s3://bucket/pre/fix?endpoint=http://h:8333&access_key=AK&secret_key=SECRET"
    cfg = replace(BrokerConfig(), store_url=s3, namespace="ns")
    assert log_dir_name(cfg) == "s3://bucket/pre/fix/ns"
    cfg = replace(BrokerConfig(), store_url="s3://user:pw@bucket:9000/p", namespace="ns")
    assert log_dir_name(cfg) == "s3://bucket:9000/p/ns"
    cfg = replace(BrokerConfig(), store_url="file:///var/lib/kafscale/", namespace="default")
    assert log_dir_name(cfg) == "file:///var/lib/kafscale/default"
