"""Zero-copy Fetch response encoding vs kafka-python's encoder, every version 4-18."""

from __future__ import annotations

import time
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchResponse

from protocol.codec import encode_response
from protocol.errors import ErrorCode, KafkaProtocolError
from protocol.fetch_fast import (
    AbortedTransaction,
    FetchPartitionData,
    FetchResponseData,
    FetchTopicData,
    encode_fetch_response,
)
from protocol.frame import Buffer

VERSIONS = range(4, 19)
TopicResp = FetchResponse.FetchableTopicResponse
PartResp = FetchResponse.FetchableTopicResponse.PartitionData
Aborted = FetchResponse.FetchableTopicResponse.PartitionData.AbortedTransaction

i64 = st.integers(-1, 2**62)
chunks = st.lists(st.binary(max_size=200), max_size=3)
aborted = st.one_of(st.none(), st.lists(st.tuples(i64, i64), max_size=3))
partition = st.tuples(
    st.integers(0, 2**31 - 1),
    st.integers(-1, 120),
    i64,
    i64,
    i64,
    aborted,
    st.integers(-1, 9),
    chunks,
)
topic = st.tuples(st.text(min_size=1, max_size=20), st.uuids(), st.lists(partition, max_size=3))


def _kafka_python(version: int, top: tuple[int, int, int], topics: list) -> bytes:
    throttle, error, session = top
    return bytes(
        FetchResponse[version](
            throttle_time_ms=throttle,
            error_code=error,
            session_id=session,
            responses=[
                TopicResp(
                    topic=name,
                    topic_id=tid,
                    partitions=[
                        PartResp(
                            partition_index=i,
                            error_code=e,
                            high_watermark=hw,
                            last_stable_offset=lso,
                            log_start_offset=lsn,
                            aborted_transactions=None
                            if ab is None
                            else [Aborted(producer_id=a, first_offset=b) for a, b in ab],
                            preferred_read_replica=rr,
                            records=b"".join(rec),
                        )
                        for i, e, hw, lso, lsn, ab, rr, rec in parts
                    ],
                )
                for name, tid, parts in topics
            ],
        ).encode()
    )


def _ours(version: int, top: tuple[int, int, int], topics: list) -> list:
    data = FetchResponseData(
        *top,
        topics=[
            FetchTopicData(name, tid, [FetchPartitionData(*p) for p in parts])
            for name, tid, parts in topics
        ],
    )
    return encode_fetch_response(version, data)


@settings(max_examples=80, deadline=None)
@given(
    version=st.sampled_from(VERSIONS),
    top=st.tuples(st.integers(0, 10**6), st.integers(-1, 120), st.integers(0, 2**31 - 1)),
    topics=st.lists(topic, max_size=3),
)
def test_matches_kafka_python_byte_for_byte(
    version: int, top: tuple[int, int, int], topics: list
) -> None:
    ours = _ours(version, top, topics)
    assert b"".join(bytes(b) for b in ours) == _kafka_python(version, top, topics)
    # every non-empty records chunk is in the output as the same object
    ids = {id(b) for b in ours}
    for _n, _t, parts in topics:
        for p in parts:
            for chunk in p[-1]:
                if chunk:
                    assert id(chunk) in ids


@pytest.mark.parametrize("version", VERSIONS)
def test_empty_records_are_empty_not_null(version: int) -> None:
    data = FetchResponseData(
        topics=[FetchTopicData("t", uuid.uuid4(), [FetchPartitionData(0, high_watermark=5)])]
    )
    wire = b"".join(bytes(b) for b in encode_fetch_response(version, data))
    decoded = FetchResponse.decode(wire, version=version)
    part = decoded.responses[0].partitions[0]
    assert part.records == b""  # kafka-python decodes null as None
    assert part.high_watermark == 5 and part.preferred_read_replica == -1


@pytest.mark.parametrize("version", VERSIONS)
def test_decoded_by_kafka_python(version: int) -> None:
    tid = uuid.uuid4()
    rec: list[Buffer] = [b"batch-one", memoryview(bytearray(b"batch-two"))]
    data = FetchResponseData(
        throttle_time_ms=3,
        session_id=11,
        topics=[
            FetchTopicData(
                "orders",
                tid,
                [FetchPartitionData(2, 0, 100, 90, 7, [AbortedTransaction(5, 6)], -1, rec)],
            )
        ],
    )
    frame = encode_response(1, version, 77, encode_fetch_response(version, data))
    assert any(b is rec[0] for b in frame) and any(b is rec[1] for b in frame)
    wire = b"".join(bytes(b) for b in frame)
    decoded = FetchResponse.decode(wire[4:], version=version, header=True)
    assert decoded.header.correlation_id == 77
    t = decoded.responses[0]
    assert (t.topic_id == tid) if version >= 13 else (t.topic == "orders")
    p = t.partitions[0]
    assert (p.partition_index, p.high_watermark, p.last_stable_offset, p.records) == (
        2,
        100,
        90,
        b"batch-onebatch-two",
    )
    assert [(a.producer_id, a.first_offset) for a in p.aborted_transactions] == [(5, 6)]
    if version >= 7:
        assert (decoded.throttle_time_ms, decoded.session_id) == (3, 11)


def test_unsupported_versions() -> None:
    for version in (3, 19):
        with pytest.raises(KafkaProtocolError) as info:
            encode_fetch_response(version, FetchResponseData())
        assert info.value.code is ErrorCode.UNSUPPORTED_VERSION


def test_ten_mib_fast_path_keeps_identity_and_reports_timing() -> None:
    """Micro-check: 10 x 1 MiB records; prints figures, asserts identity only."""
    blobs = [bytes([i]) * (1 << 20) for i in range(10)]
    parts = [FetchPartitionData(i, high_watermark=1, records=[blobs[i]]) for i in range(10)]
    data = FetchResponseData(topics=[FetchTopicData("big", uuid.uuid4(), parts)])
    theirs_obj = FetchResponse[12](
        responses=[TopicResp(topic="big", partitions=[
            PartResp(partition_index=i, high_watermark=1, records=blobs[i]) for i in range(10)
        ])]
    )  # fmt: skip
    t0 = time.perf_counter()
    ours = encode_fetch_response(12, data)
    t1 = time.perf_counter()
    theirs = theirs_obj.encode()
    t2 = time.perf_counter()
    assert [b for b in ours if len(b) == 1 << 20] == blobs
    assert all(any(b is blob for b in ours) for blob in blobs)
    assert sum(len(b) for b in ours) == len(theirs)
    print(
        f"\nfetch v12 10x1MiB: fast path {1e6 * (t1 - t0):.0f} us,"
        f" kafka-python {1e6 * (t2 - t1):.0f} us"
    )
