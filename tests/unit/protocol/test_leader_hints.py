"""KIP-951 leader hints in Produce (v10+) and Fetch (v12+, endpoints v16+) responses, read
back by kafka-python's decoders (generated from Kafka's message definitions); versions
without the fields get exactly the bytes they got before."""

from __future__ import annotations

import uuid

import pytest
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.producer import ProduceResponse

from protocol.fetch_fast import (
    FetchPartitionData,
    FetchResponseData,
    FetchTopicData,
    encode_fetch_response,
)
from protocol.leader_hints import NodeEndpoint
from protocol.produce_fast import (
    ProducePartitionResult,
    ProduceTopicResult,
    encode_produce_response,
)

MOVED = 6  # NOT_LEADER_OR_FOLLOWER
NODES = [NodeEndpoint(2, "broker-2.example", 9093, None), NodeEndpoint(5, "b5", 19092, "rack-a")]
TID = uuid.uuid4()


def _produce(version: int, hinted: bool) -> bytes:
    leader = (2, 7) if hinted else None
    parts = [
        ProducePartitionResult(3, MOVED, current_leader=leader),
        ProducePartitionResult(4, 0, 5),
    ]
    nodes = NODES if hinted else ()
    return b"".join(
        encode_produce_response(version, [ProduceTopicResult("t", parts, TID)], 0, nodes)
    )


@pytest.mark.parametrize("version", [10, 11, 12, 13])
def test_produce_hints_from_v10(version: int) -> None:
    r = ProduceResponse[version].decode(_produce(version, True))
    moved, ok = r.responses[0].partition_responses
    assert (moved.error_code, moved.current_leader.leader_id) == (MOVED, 2)
    assert moved.current_leader.leader_epoch == 7
    assert ok.current_leader is None and ok.base_offset == 5
    got = [(n.node_id, n.host, n.port, n.rack) for n in r.node_endpoints]
    assert got == [tuple(n) for n in NODES]


@pytest.mark.parametrize("version", range(0, 10))
def test_produce_before_v10_is_unchanged(version: int) -> None:
    assert _produce(version, True) == _produce(version, False)


def _fetch(version: int, hinted: bool) -> bytes:
    leader = (2, 7) if hinted else None
    parts = [FetchPartitionData(0, MOVED, current_leader=leader), FetchPartitionData(1, 0, 10)]
    resp = FetchResponseData(
        topics=[FetchTopicData("t", TID, parts)], node_endpoints=NODES if hinted else ()
    )
    return b"".join(bytes(b) for b in encode_fetch_response(version, resp))


@pytest.mark.parametrize("version", range(12, 19))
def test_fetch_current_leader_from_v12_endpoints_from_v16(version: int) -> None:
    r = FetchResponse[version].decode(_fetch(version, True))
    moved, ok = r.responses[0].partitions
    assert (moved.current_leader.leader_id, moved.current_leader.leader_epoch) == (2, 7)
    assert ok.current_leader is None and ok.high_watermark == 10
    if version >= 16:
        got = [(n.node_id, n.host, n.port, n.rack) for n in r.node_endpoints]
        assert got == [tuple(n) for n in NODES]
    else:  # the same bytes as the response with the leader alone
        leader_only = FetchResponseData(
            topics=[FetchTopicData("t", TID, [FetchPartitionData(0, MOVED, current_leader=(2, 7)),
                                              FetchPartitionData(1, 0, 10)])]
        )  # fmt: skip
        assert _fetch(version, True) == b"".join(
            bytes(b) for b in encode_fetch_response(version, leader_only)
        )


@pytest.mark.parametrize("version", range(4, 12))
def test_fetch_before_v12_is_unchanged(version: int) -> None:
    assert _fetch(version, True) == _fetch(version, False)
