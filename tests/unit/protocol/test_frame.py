"""Request framing and header parsing, checked against kafka-python's own encoder."""

from __future__ import annotations

import struct

import pytest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kafka.protocol.producer import ProduceRequest

from protocol.apis import FIRST_FLEXIBLE, ApiKey, api_name, first_flexible_version
from protocol.codec import known_request_classes, known_response_classes
from protocol.errors import ErrorCode, KafkaProtocolError
from protocol.frame import (
    FRAME_SIZE,
    MalformedFrameError,
    RequestHeader,
    is_flexible_request,
    parse_request_header,
    read_frame_size,
    read_uvarint,
    skip_tagged_fields,
)


def _frame(request: object, correlation_id: int, client_id: str | None) -> bytes:
    request.with_header(correlation_id=correlation_id, client_id=client_id)  # type: ignore[attr-defined]
    return bytes(request.encode(header=True, framed=True))  # type: ignore[attr-defined]


def _raw_header(key: int, version: int, corr: int, client: bytes | None, tags: bytes) -> bytes:
    cid = struct.pack(">h", -1) if client is None else struct.pack(">h", len(client)) + client
    return struct.pack(">hhi", key, version, corr) + cid + tags


@pytest.mark.parametrize("version", range(0, 14))
@pytest.mark.parametrize("client_id", ["kafka-python", "", None, "ünïcode-id"])
def test_metadata_header_every_version(version: int, client_id: str | None) -> None:
    req = MetadataRequest[version](topics=[MetadataRequest.MetadataRequestTopic(name="t")])
    body = bytes(req.encode())
    frame = _frame(req, 1234, client_id)
    assert read_frame_size(frame) == len(frame) - 4
    hdr = parse_request_header(memoryview(frame)[4:])
    assert hdr == RequestHeader(3, version, 1234, client_id, len(frame) - 4 - len(body))
    assert frame[4 + hdr.size :] == body
    # header v2 (flexible) has exactly one more byte: the empty tagged-field section
    cid_len = 0 if client_id is None else len(client_id.encode())
    assert hdr.size == 10 + cid_len + (1 if version >= 9 else 0)


@pytest.mark.parametrize("version", range(0, 5))
def test_api_versions_known_versions(version: int) -> None:
    req = ApiVersionsRequest[version]()
    frame = _frame(req, 9, "c")
    hdr = parse_request_header(memoryview(frame)[4:])
    assert (hdr.api_key, hdr.api_version, hdr.correlation_id, hdr.client_id) == (
        18,
        version,
        9,
        "c",
    )
    assert frame[4 + hdr.size :] == bytes(req.encode())


def test_api_versions_v5_from_a_newer_client_parses_as_flexible() -> None:
    # v5 is above kafka-python's maximum (4); the header still parses, tags skipped
    tags = b"\x02\x00\x01\xaa\x05\x03xyz"  # two unknown header tags
    raw = _raw_header(18, 5, 77, b"java-client", tags) + b"BODY"
    hdr = parse_request_header(memoryview(raw))
    assert hdr == RequestHeader(18, 5, 77, "java-client", len(raw) - 4)
    assert raw[hdr.size :] == b"BODY"


@pytest.mark.parametrize(
    ("key", "version", "flexible"),
    [
        (68, 0, True),  # ConsumerGroupHeartbeat: unknown to kafka-python, flexible from v0
        (4, 3, False),  # LeaderAndIsr v3: not flexible
        (4, 4, True),
        (200, 0, True),  # a key from the future: new APIs are flexible
        (17, 7, False),  # SaslHandshake is never flexible
        (0, 8, False),
        (0, 9, True),
        (0, 42, True),  # above kafka-python's max, monotonic extension
        (1, -1, False),  # negative version: never flexible, still parses
    ],
)
def test_unknown_keys_and_versions(key: int, version: int, flexible: bool) -> None:
    assert is_flexible_request(key, version) is flexible
    tags = b"\x01\x05\x02hi" if flexible else b""
    raw = _raw_header(key, version, -5, None, tags) + b"rest"
    hdr = parse_request_header(memoryview(raw))
    assert hdr == RequestHeader(key, version, -5, None, len(raw) - 4)


def test_flexible_table_matches_kafka_python_for_every_version() -> None:
    """protocol.apis alone decides flexibility; kafka-python's generated classes (from
    Kafka's schemas) must agree, request and response, version by version."""
    for table in (known_request_classes(), known_response_classes()):
        for key, cls in table.items():
            flex = cls._flexible_versions
            expected = None if flex is None or flex[0] < 0 else flex[0]
            assert first_flexible_version(key) == expected, key
            assert key in FIRST_FLEXIBLE or key > 54, key
            for version in range(cls.min_version, cls.max_version + 1):
                assert is_flexible_request(key, version) == bool(cls.flexible_version_q(version))


def test_api_keys_by_name() -> None:
    assert ApiKey.API_VERSIONS == 18 and ApiKey(0) is ApiKey.PRODUCE
    assert api_name(1) == "FETCH" and api_name(999) == "key 999"
    assert [k.value for k in ApiKey] == list(range(len(ApiKey)))  # no key skipped


def test_every_truncation_of_a_header_raises() -> None:
    req = ProduceRequest[9](acks=1, timeout_ms=5, topic_data=[])
    frame = _frame(req, 3, "client")[4:]
    hdr = parse_request_header(memoryview(frame))
    for cut in range(hdr.size):
        with pytest.raises(MalformedFrameError) as info:
            parse_request_header(memoryview(frame[:cut]))
        assert info.value.code is ErrorCode.CORRUPT_MESSAGE
        assert isinstance(info.value, KafkaProtocolError)


def test_bad_client_id_length_and_bad_utf8() -> None:
    with pytest.raises(MalformedFrameError):
        parse_request_header(memoryview(struct.pack(">hhih", 3, 1, 1, -2)))
    raw = _raw_header(3, 1, 1, b"\xff\xfe", b"")
    assert parse_request_header(memoryview(raw)).client_id == "\ufffd\ufffd"


def test_tagged_field_overrun_raises() -> None:
    raw = _raw_header(3, 12, 1, b"c", b"\x01\x00\x10ab")  # claims 16 bytes, has 2
    with pytest.raises(MalformedFrameError):
        parse_request_header(memoryview(raw))


def test_read_frame_size() -> None:
    assert read_frame_size(FRAME_SIZE.pack(17) + b"x") == 17
    assert read_frame_size(memoryview(FRAME_SIZE.pack(0))) == 0
    with pytest.raises(MalformedFrameError):
        read_frame_size(b"\x00\x00\x01")
    with pytest.raises(MalformedFrameError):
        read_frame_size(FRAME_SIZE.pack(-1))
    with pytest.raises(MalformedFrameError):
        read_frame_size(FRAME_SIZE.pack(1001), max_size=1000)


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 16383, 16384, 2**28 - 1, 2**32 - 1])
def test_uvarint(value: int) -> None:
    enc = bytearray()
    v = value
    while v & ~0x7F:
        enc.append((v & 0x7F) | 0x80)
        v >>= 7
    enc.append(v)
    assert read_uvarint(b"?" + bytes(enc) + b"!", 1) == (value, 1 + len(enc))
    with pytest.raises(MalformedFrameError):
        read_uvarint(bytes(enc[:-1]), 0)


def test_uvarint_longer_than_five_bytes_raises() -> None:
    with pytest.raises(MalformedFrameError):
        read_uvarint(b"\x80\x80\x80\x80\x80\x01", 0)


def test_skip_tagged_fields() -> None:
    data = b"\x02\x00\x02ab\x07\x00" + b"tail"
    assert skip_tagged_fields(data, 0) == len(data) - 4
    assert skip_tagged_fields(b"\x00", 0) == 1
