"""Request decoding and response framing, checked against kafka-python's own codec."""

from __future__ import annotations

import struct

import pytest
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import ApiVersionsResponse, MetadataRequest, MetadataResponse
from kafka.protocol.producer import ProduceRequest

from protocol.codec import (
    api_versions_fallback,
    decode_request,
    encode_response,
    is_flexible,
    known_request_classes,
    max_known_version,
    request_class,
    response_class,
)
from protocol.errors import ErrorCode, KafkaProtocolError


def _join(buffers: list[bytes | bytearray | memoryview]) -> bytes:
    return b"".join(bytes(b) for b in buffers)


def test_classes_and_versions() -> None:
    assert request_class(0) is ProduceRequest
    assert request_class(3) is MetadataRequest
    assert response_class(3) is MetadataResponse
    expected = {0: 13, 1: 18, 2: 11, 3: 13, 8: 10, 9: 10, 11: 9, 18: 4, 19: 7, 22: 6}
    assert {k: max_known_version(k) for k in expected} == expected
    assert max_known_version(68) == 1  # protocol.consumer_groups (KIP-848)
    assert max_known_version(80) == -1
    for key in (80, 4, 999):
        with pytest.raises(KafkaProtocolError) as info:
            request_class(key)
        assert info.value.code is ErrorCode.INVALID_REQUEST
        with pytest.raises(KafkaProtocolError):
            response_class(key)


@pytest.mark.parametrize(
    ("key", "version", "flexible"),
    [(0, 8, False), (0, 9, True), (1, 11, False), (1, 12, True), (18, 2, False), (18, 3, True),
     (18, 5, True), (3, 9, True), (17, 1, False), (68, 0, True), (999, 3, True)],
)  # fmt: skip
def test_is_flexible(key: int, version: int, flexible: bool) -> None:
    assert is_flexible(key, version) is flexible
    assert is_flexible(key, version, request=False) is flexible


def test_every_known_request_round_trips_at_every_version() -> None:
    count = 0
    for key, cls in known_request_classes().items():
        for version in range(cls.max_version + 1):
            original = cls[version]()
            decoded = decode_request(key, version, memoryview(bytes(original.encode())))
            assert decoded == original
            assert decoded.API_VERSION == version
            count += 1
    assert count > 250


@pytest.mark.parametrize("version", range(0, 14))
def test_metadata_topics_round_trip(version: int) -> None:
    topics = [MetadataRequest.MetadataRequestTopic(name=n) for n in ("a", "bé", "c" * 200)]
    req = MetadataRequest[version](topics=topics, allow_auto_topic_creation=False)
    body = bytes(req.encode())
    got = decode_request(3, version, memoryview(body))
    assert [t.name for t in got.topics] == ["a", "bé", "c" * 200]
    assert got == MetadataRequest.decode(body, version=version)
    assert got.allow_auto_topic_creation is (version < 4)  # field exists from v4 on


@pytest.mark.parametrize("version", range(1, 14))
def test_metadata_null_topics_decode_to_none_and_empty_to_empty(version: int) -> None:
    null = decode_request(
        3, version, memoryview(bytes(MetadataRequest[version](topics=None).encode()))
    )
    assert null.topics is None
    empty = decode_request(
        3, version, memoryview(bytes(MetadataRequest[version](topics=[]).encode()))
    )
    assert empty.topics == []


def test_decode_accepts_trailing_bytes_and_subviews() -> None:
    req = FetchRequest[12](max_wait_ms=500, min_bytes=1, topics=[])
    data = b"HEADER" + bytes(req.encode()) + b"\x00\x00"
    assert decode_request(1, 12, memoryview(data)[6:]) == req


def test_decode_errors() -> None:
    body = bytes(
        MetadataRequest[8](topics=[MetadataRequest.MetadataRequestTopic(name="abc")]).encode()
    )
    for cut in range(len(body)):
        with pytest.raises(KafkaProtocolError) as info:
            decode_request(3, 8, memoryview(body[:cut]))
        assert info.value.code is ErrorCode.CORRUPT_MESSAGE
    with pytest.raises(KafkaProtocolError) as info:
        decode_request(3, 14, memoryview(body))
    assert info.value.code is ErrorCode.UNSUPPORTED_VERSION
    with pytest.raises(KafkaProtocolError) as info:
        decode_request(3, -1, memoryview(body))
    assert info.value.code is ErrorCode.UNSUPPORTED_VERSION
    with pytest.raises(KafkaProtocolError) as info:
        decode_request(80, 0, memoryview(body))
    assert info.value.code is ErrorCode.INVALID_REQUEST


def _metadata_response(version: int) -> object:
    broker = MetadataResponse.MetadataResponseBroker(node_id=1, host="127.0.0.1", port=9092)
    return MetadataResponse[version](
        throttle_time_ms=0, brokers=[broker], cluster_id="c", controller_id=1, topics=[]
    )


@pytest.mark.parametrize("version", range(0, 14))
def test_encode_response_matches_kafka_python_framing(version: int) -> None:
    resp = _metadata_response(version)
    frame = encode_response(3, version, 4242, resp)
    resp.with_header(correlation_id=4242)  # type: ignore[attr-defined]
    assert _join(frame) == bytes(resp.encode(header=True, framed=True))  # type: ignore[attr-defined]
    header_len = len(frame[0]) - 4
    assert header_len == (5 if version >= 9 else 4)


@pytest.mark.parametrize("version", range(0, 5))
def test_api_versions_response_always_uses_header_v0(version: int) -> None:
    keys = [
        ApiVersionsResponse.ApiVersion(api_key=k, min_version=0, max_version=3) for k in (0, 18)
    ]
    resp = ApiVersionsResponse[version](error_code=0, api_keys=keys, throttle_time_ms=0)
    frame = encode_response(18, version, 5, resp)
    assert len(frame[0]) == 8  # size + correlation id, no tagged-field byte
    resp.with_header(correlation_id=5)
    assert _join(frame) == bytes(resp.encode(header=True, framed=True))
    decoded = ApiVersionsResponse.decode(_join(frame)[4:], version=version, header=True)
    assert decoded.header.correlation_id == 5
    assert [(k.api_key, k.max_version) for k in decoded.api_keys] == [(0, 3), (18, 3)]


def test_encode_response_passes_buffers_through_uncopied() -> None:
    a = b"\x00" * 10
    b = memoryview(bytearray(b"\x01" * 7))
    c = memoryview(struct.pack(">4i", 1, 2, 3, 4)).cast("i")  # non-byte format: 16 bytes
    flexible = encode_response(1, 12, 99, [a, b, c])
    assert flexible[1] is a and flexible[2] is b and flexible[3] is c
    assert flexible[0] == struct.pack(">iiB", 5 + 10 + 7 + 16, 99, 0)
    plain = encode_response(1, 11, 99, [a])
    assert plain == [struct.pack(">ii", 4 + 10, 99), a]
    assert encode_response(1, 11, 1, []) == [struct.pack(">ii", 4, 1)]


def test_api_versions_fallback_decodes_as_v0_with_error_35() -> None:
    keys = [(0, 0, 11), (1, 4, 16), (18, 0, 4)]
    frame = _join(api_versions_fallback(31337, keys))
    assert struct.unpack_from(">i", frame)[0] == len(frame) - 4
    # kafka-python's client decodes it at the requested (too high) version: its
    # ApiVersionsResponse falls back to the v0 body when an error is present
    resp = ApiVersionsResponse.decode(frame[4:], version=4, header=True)
    assert resp.header.correlation_id == 31337
    assert resp.error_code == ErrorCode.UNSUPPORTED_VERSION == 35
    assert [(k.api_key, k.min_version, k.max_version) for k in resp.api_keys] == keys
    # and the body is exactly the v0 layout, nothing after it
    v0 = ApiVersionsResponse[0](
        error_code=35,
        api_keys=[
            ApiVersionsResponse.ApiVersion(api_key=k, min_version=lo, max_version=hi)
            for k, lo, hi in keys
        ],
    )
    assert frame[8:] == bytes(v0.encode())
