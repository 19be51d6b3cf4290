"""Fuzzing: random, truncated and bit-flipped bytes must only ever raise KafkaProtocolError.

Each test is bounded in examples and guarded by a per-test timeout, so a decoder that
hangs (or loops over a forged billion-element array) fails instead of stalling the run.
"""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchRequest, OffsetCommitRequest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kafka.protocol.producer import ProduceRequest

from protocol.codec import decode_request, max_known_version
from protocol.errors import KafkaProtocolError
from protocol.frame import parse_request_header
from protocol.produce_fast import decode_produce

FUZZ = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
KEYS = [0, 1, 2, 3, 8, 9, 10, 11, 14, 18, 19, 22]


def _seeds() -> list[tuple[int, int, bytes]]:
    """Valid bodies to mutate: (api key, version, body)."""
    tid = uuid.UUID(int=7)
    out: list[tuple[int, int, bytes]] = []
    for v in range(0, 14):
        topic = ProduceRequest.TopicProduceData(
            name="topic",
            topic_id=tid,
            partition_data=[
                ProduceRequest.TopicProduceData.PartitionProduceData(index=1, records=b"x" * 40)
            ],
        )
        req = ProduceRequest[v](
            transactional_id="t" if v >= 3 else None, acks=1, timeout_ms=9, topic_data=[topic]
        )
        out.append((0, v, bytes(req.encode())))
        mt = [
            MetadataRequest.MetadataRequestTopic(name="a"),
            MetadataRequest.MetadataRequestTopic(name="bb"),
        ]
        out.append((3, v, bytes(MetadataRequest[v](topics=mt).encode())))
    for v in range(0, 19):
        ft = FetchRequest.FetchTopic(
            topic="f",
            topic_id=tid,
            partitions=[FetchRequest.FetchTopic.FetchPartition(partition=0, fetch_offset=5)],
        )
        out.append((1, v, bytes(FetchRequest[v](max_wait_ms=1, topics=[ft]).encode())))
    for v in range(0, 5):
        out.append((18, v, bytes(ApiVersionsRequest[v](client_software_name="x").encode())))
    for v in range(0, 11):
        out.append((8, v, bytes(OffsetCommitRequest[v](group_id="g", topics=[]).encode())))
    return out


SEEDS = _seeds()


@st.composite
def mutated(draw: st.DrawFn) -> tuple[int, int, bytes]:
    key, version, body = draw(st.sampled_from(SEEDS))
    data = bytearray(body)
    for _ in range(draw(st.integers(0, 4))):
        if not data:
            break
        pos = draw(st.integers(0, len(data) - 1))
        data[pos] = draw(st.integers(0, 255))
    cut = draw(st.integers(0, len(data)))
    return key, version, bytes(data[:cut])


def _only_protocol_errors(fn: object, *args: object) -> None:
    try:
        fn(*args)  # type: ignore[operator]
    except KafkaProtocolError:
        pass


@pytest.mark.timeout(120)
@FUZZ
@given(data=st.binary(max_size=64))
def test_parse_request_header_random_bytes(data: bytes) -> None:
    try:
        hdr = parse_request_header(memoryview(data))
    except KafkaProtocolError:
        return
    assert 10 <= hdr.size <= len(data)


@pytest.mark.timeout(120)
@FUZZ
@given(key=st.sampled_from(KEYS), version=st.integers(0, 20), data=st.binary(max_size=200))
def test_decode_request_random_bytes(key: int, version: int, data: bytes) -> None:
    _only_protocol_errors(
        decode_request, key, min(version, max_known_version(key) + 1), memoryview(data)
    )


@pytest.mark.timeout(120)
@FUZZ
@given(case=mutated())
def test_decode_request_mutated_bodies(case: tuple[int, int, bytes]) -> None:
    key, version, body = case
    _only_protocol_errors(decode_request, key, version, memoryview(body))


@pytest.mark.timeout(120)
@FUZZ
@given(version=st.integers(0, 13), data=st.binary(max_size=200))
def test_decode_produce_random_bytes(version: int, data: bytes) -> None:
    _only_protocol_errors(decode_produce, memoryview(data), version)


@pytest.mark.timeout(120)
@FUZZ
@given(case=mutated())
def test_decode_produce_mutated_bodies(case: tuple[int, int, bytes]) -> None:
    key, version, body = case
    if key == 0:
        _only_protocol_errors(decode_produce, memoryview(body), version)
