"""Zero-copy Produce decoding and Produce response encoding vs kafka-python, every version."""

from __future__ import annotations

import struct
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from protocol.errors import ErrorCode, KafkaProtocolError
from protocol.produce_fast import (
    ProducePartitionData,
    ProducePartitionResult,
    ProduceRequestData,
    ProduceTopicData,
    ProduceTopicResult,
    decode_produce,
    encode_produce_response,
)

VERSIONS = range(0, 14)
TopicData = ProduceRequest.TopicProduceData
PartitionData = ProduceRequest.TopicProduceData.PartitionProduceData
TopicResp = ProduceResponse.TopicProduceResponse
PartResp = ProduceResponse.TopicProduceResponse.PartitionProduceResponse

names = st.text(min_size=1, max_size=30)
blobs = st.one_of(st.none(), st.binary(max_size=300))
partitions = st.lists(st.tuples(st.integers(0, 2**31 - 1), blobs), max_size=4)
topics = st.lists(st.tuples(names, st.uuids(), partitions), max_size=4)


def _kp_request(version: int, txn: str | None, acks: int, timeout: int, tps: list) -> bytes:
    data = [
        TopicData(
            name=n, topic_id=tid, partition_data=[PartitionData(index=i, records=r) for i, r in ps]
        )
        for n, tid, ps in tps
    ]
    req = ProduceRequest[version](
        transactional_id=txn if version >= 3 else None,
        acks=acks,
        timeout_ms=timeout,
        topic_data=data,
    )
    return bytes(req.encode())


def _expected(
    version: int, txn: str | None, acks: int, timeout: int, tps: list
) -> ProduceRequestData:
    by_id = version >= 13
    return ProduceRequestData(
        txn if version >= 3 else None,
        acks,
        timeout,
        [
            ProduceTopicData(
                "" if by_id else n,
                [ProducePartitionData(i, r) for i, r in ps],
                tid if by_id else None,
            )
            for n, tid, ps in tps
        ],
    )


@settings(max_examples=60, deadline=None)
@given(
    version=st.sampled_from(VERSIONS),
    txn=st.one_of(st.none(), names),
    acks=st.sampled_from([-1, 0, 1]),
    timeout=st.integers(-(2**31), 2**31 - 1),
    tps=topics,
)
def test_decode_matches_kafka_python(
    version: int, txn: str | None, acks: int, timeout: int, tps: list
) -> None:
    wire = _kp_request(version, txn, acks, timeout, tps)
    buf = bytearray(wire)
    got = decode_produce(memoryview(buf), version)
    # memoryview == bytes compares contents, so the dataclasses compare field by field
    assert got == _expected(version, txn, acks, timeout, tps)
    theirs = ProduceRequest.decode(wire, version=version)
    assert got.acks == theirs.acks and got.timeout_ms == theirs.timeout_ms
    for ours_t, their_t in zip(got.topics, theirs.topic_data, strict=True):
        assert [
            (p.index, None if p.records is None else bytes(p.records)) for p in ours_t.partitions
        ] == [(p.index, p.records) for p in their_t.partition_data]
        for p in ours_t.partitions:
            if p.records is not None:
                assert p.records.obj is buf  # a slice of the caller's buffer: no copy


def test_records_are_patchable_in_place() -> None:
    batch = bytes(range(70))
    wire = _kp_request(9, None, 1, 100, [("t", uuid.UUID(int=1), [(0, batch)])])
    buf = bytearray(wire)
    rec = decode_produce(memoryview(buf), 9).topics[0].partitions[0].records
    assert rec is not None and rec.readonly is False
    struct.pack_into(">q", rec, 0, 123456789)  # baseOffset
    start = buf.index(batch[8:])  # the untouched tail locates the batch in the frame
    assert struct.unpack_from(">q", buf, start - 8)[0] == 123456789


def _flexible_request_with_unknown_tags() -> bytes:
    out = bytearray()
    out += b"\x00"  # null transactional_id (compact)
    out += struct.pack(">hi", -1, 30000)
    out += b"\x02"  # 1 topic
    out += b"\x02t"  # name "t"
    out += b"\x02"  # 1 partition
    out += struct.pack(">i", 7)
    out += b"\x04abc"  # records (3 bytes)
    out += b"\x01\x09\x02zz"  # partition tags: one unknown tag 9 with 2 bytes
    out += b"\x02\x00\x00\x05\x01q"  # topic tags: tag 0 empty, tag 5 one byte
    out += b"\x01\x7f\x03xyz"  # top-level tags
    return bytes(out)


def test_unknown_tagged_fields_are_skipped() -> None:
    got = decode_produce(memoryview(_flexible_request_with_unknown_tags()), 10)
    assert got == ProduceRequestData(
        None, -1, 30000, [ProduceTopicData("t", [ProducePartitionData(7, memoryview(b"abc"))])]
    )
    # kafka-python agrees on the same bytes
    theirs = ProduceRequest.decode(_flexible_request_with_unknown_tags(), version=10)
    assert theirs.topic_data[0].partition_data[0].records == b"abc"


@pytest.mark.parametrize("version", VERSIONS)
def test_every_truncation_raises_corrupt_message(version: int) -> None:
    wire = _kp_request(version, "tx", 1, 5, [("topic", uuid.uuid4(), [(0, b"r" * 20), (1, None)])])
    assert decode_produce(memoryview(wire), version).topics[0].partitions[1].records is None
    for cut in range(len(wire)):
        with pytest.raises(KafkaProtocolError) as info:
            decode_produce(memoryview(wire[:cut]), version)
        assert info.value.code is ErrorCode.CORRUPT_MESSAGE


def test_bad_lengths_and_versions() -> None:
    with pytest.raises(KafkaProtocolError) as info:
        decode_produce(memoryview(b""), 14)
    assert info.value.code is ErrorCode.UNSUPPORTED_VERSION
    huge_count = struct.pack(">hii", 1, 0, 2**31 - 1)  # v0: acks, timeout, topic count
    with pytest.raises(KafkaProtocolError):
        decode_produce(memoryview(huge_count), 0)
    bad_utf8 = struct.pack(">hiih", 1, 0, 1, 2) + b"\xff\xfe" + struct.pack(">i", 0)
    with pytest.raises(KafkaProtocolError):
        decode_produce(memoryview(bad_utf8), 0)


results = st.lists(
    st.tuples(
        st.integers(0, 1000),
        st.integers(-1, 120),
        st.integers(-1, 2**62),
        st.integers(-1, 2**40),
        st.integers(-1, 2**40),
        st.one_of(st.none(), st.text(max_size=20)),
    ),
    max_size=4,
)


@settings(max_examples=60, deadline=None)
@given(
    version=st.sampled_from(VERSIONS),
    tps=st.lists(st.tuples(names, st.uuids(), results), max_size=3),
    throttle=st.integers(0, 10000),
)
def test_response_matches_kafka_python(version: int, tps: list, throttle: int) -> None:
    theirs = ProduceResponse[version](
        responses=[
            TopicResp(
                name=n,
                topic_id=tid,
                partition_responses=[
                    PartResp(
                        index=i,
                        error_code=e,
                        base_offset=b,
                        log_append_time_ms=t,
                        log_start_offset=s,
                        record_errors=[],
                        error_message=m,
                    )
                    for i, e, b, t, s, m in ps
                ],
            )
            for n, tid, ps in tps
        ],
        throttle_time_ms=throttle,
    ).encode()
    ours = encode_produce_response(
        version,
        [
            ProduceTopicResult(n, [ProducePartitionResult(*p) for p in ps], tid)
            for n, tid, ps in tps
        ],
        throttle_time_ms=throttle,
    )
    assert b"".join(ours) == bytes(theirs)


def test_response_unsupported_version() -> None:
    with pytest.raises(KafkaProtocolError):
        encode_produce_response(14, [])
