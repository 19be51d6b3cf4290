"""Zero-copy Produce request decoding (v0-v13) and Produce response encoding.

``decode_produce`` returns the record sets as slices of the input memoryview: nothing is
copied, and when the caller's buffer is a writable ``bytearray`` the broker can patch
``baseOffset``/``partitionLeaderEpoch`` in place. v9+ is flexible (compact strings and
arrays, tagged fields, which are skipped); v13+ names topics by ``topic_id``.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from protocol.errors import ErrorCode, KafkaProtocolError
from protocol.frame import Buffer, MalformedFrameError, read_uvarint, skip_tagged_fields
from protocol.frame import uvarint as _uvarint
from protocol.leader_hints import NodeEndpoint, current_leader, node_endpoints, tagged_fields

MIN_VERSION = 0
MAX_VERSION = 13
FIRST_FLEXIBLE = 9
FIRST_LEADER_HINTS = 10  # KIP-951: current_leader, node_endpoints
FIRST_TOPIC_ID = 13

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")


@dataclass(frozen=True, slots=True)
class ProducePartitionData:
    index: int
    records: memoryview | None  # a slice of the request buffer (None: null records)


@dataclass(frozen=True, slots=True)
class ProduceTopicData:
    name: str  # "" for v13+, which carries topic_id instead
    partitions: list[ProducePartitionData]
    topic_id: uuid.UUID | None = None  # v13+ only


@dataclass(frozen=True, slots=True)
class ProduceRequestData:
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topics: list[ProduceTopicData]


def _as_bytes_view(body: Buffer) -> memoryview:
    view = body if isinstance(body, memoryview) else memoryview(body)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


# The helpers below take (buf, pos) and return (value, new pos). Fixed-size reads rely on
# struct.unpack_from / indexing raising past the end (mapped to CORRUPT_MESSAGE by
# decode_produce); slices never raise, so every slice end is checked explicitly.


def _length(buf: memoryview, pos: int, flexible: bool, wide: struct.Struct) -> tuple[int, int]:
    """A nullable length (-1 = null): compact (uvarint - 1) when flexible, else ``wide``."""
    if flexible:
        b = buf[pos]
        if b < 0x80:  # one-byte varint: the common case
            return b - 1, pos + 1
        n, pos = read_uvarint(buf, pos)
        return n - 1, pos
    (n,) = wide.unpack_from(buf, pos)
    if n < -1:
        raise MalformedFrameError(f"negative length {n}")
    return n, pos + wide.size


def _count(buf: memoryview, pos: int, flexible: bool) -> tuple[int, int]:
    """An array length, sanity-checked against the bytes left. A null array (not
    nullable in the schema, but well-framed) reads as empty: the request gets an answer."""
    n, pos = _length(buf, pos, flexible, _I32)
    if n == -1:
        return 0, pos
    if n < 0 or n > len(buf) - pos:
        raise MalformedFrameError(f"invalid array length {n}")
    return n, pos


def _string(buf: memoryview, pos: int, flexible: bool) -> tuple[str | None, int]:
    n, pos = _length(buf, pos, flexible, _I16)
    if n < 0:
        return None, pos
    stop = pos + n
    if stop > len(buf):
        raise MalformedFrameError("string truncated")
    try:
        return str(buf[pos:stop], "utf-8"), stop
    except UnicodeDecodeError:
        raise MalformedFrameError("string is not UTF-8") from None


def _skip_tags(buf: memoryview, pos: int) -> int:
    if buf[pos] == 0:  # no tagged fields: the common case
        return pos + 1
    return skip_tagged_fields(buf, pos)


def _read_partitions(
    buf: memoryview, pos: int, flex: bool
) -> tuple[list[ProducePartitionData], int]:
    n, pos = _count(buf, pos, flex)
    end = len(buf)
    partitions: list[ProducePartitionData] = []
    for _ in range(n):
        (index,) = _I32.unpack_from(buf, pos)
        size, pos = _length(buf, pos + 4, flex, _I32)
        records: memoryview | None = None
        if size >= 0:
            stop = pos + size
            if stop > end:
                raise MalformedFrameError("records truncated")
            records = buf[pos:stop]
            pos = stop
        partitions.append(ProducePartitionData(index, records))
        if flex:
            pos = _skip_tags(buf, pos)
    return partitions, pos


def _read_topics(buf: memoryview, pos: int, version: int) -> tuple[list[ProduceTopicData], int]:
    flex = version >= FIRST_FLEXIBLE
    n, pos = _count(buf, pos, flex)
    topics: list[ProduceTopicData] = []
    for _ in range(n):
        name = ""
        topic_id: uuid.UUID | None = None
        if version >= FIRST_TOPIC_ID:
            if pos + 16 > len(buf):
                raise MalformedFrameError("topic id truncated")
            topic_id = uuid.UUID(bytes=bytes(buf[pos : pos + 16]))
            pos += 16
        else:
            maybe_name, pos = _string(buf, pos, flex)
            if maybe_name is None:
                raise MalformedFrameError("null topic name")
            name = maybe_name
        partitions, pos = _read_partitions(buf, pos, flex)
        topics.append(ProduceTopicData(name, partitions, topic_id))
        if flex:
            pos = _skip_tags(buf, pos)
    return topics, pos


def decode_produce(body: memoryview, version: int) -> ProduceRequestData:
    """Decode a Produce request body (after the header) without copying record bytes.

    Raises ``KafkaProtocolError``: ``UNSUPPORTED_VERSION`` outside v0-v13,
    ``CORRUPT_MESSAGE`` on truncation, bad lengths or non-UTF-8 strings.
    """
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise KafkaProtocolError(ErrorCode.UNSUPPORTED_VERSION, f"Produce v{version}")
    buf = _as_bytes_view(body)
    flex = version >= FIRST_FLEXIBLE
    try:
        transactional_id, pos = _string(buf, 0, flex) if version >= 3 else (None, 0)
        acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(buf, pos)
        topics, pos = _read_topics(buf, pos + _ACKS_TIMEOUT.size, version)
        if flex:
            _skip_tags(buf, pos)
    except (struct.error, IndexError):
        raise MalformedFrameError("produce request truncated") from None
    return ProduceRequestData(transactional_id, acks, timeout_ms, topics)


# ----------------------------------------------------------------------------- responses


@dataclass(frozen=True, slots=True)
class ProducePartitionResult:
    index: int
    error_code: int = 0
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    error_message: str | None = None
    # KIP-467 (v8+): (index of the record within its batch, message)
    record_errors: Sequence[tuple[int, str | None]] = ()
    # KIP-951 (v10+): (leader id, leader epoch) of a partition that moved
    current_leader: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class ProduceTopicResult:
    name: str
    partitions: Sequence[ProducePartitionResult]
    topic_id: uuid.UUID | None = None  # v13+


_PART_HEAD = struct.Struct(">ihq")  # index, error_code, base_offset


def _put_len(out: bytearray, n: int, flexible: bool, wide: struct.Struct) -> None:
    if flexible:
        out += _uvarint(n + 1)
    else:
        out += wide.pack(n)


def _put_string(out: bytearray, s: str | None, flexible: bool) -> None:
    if s is None:
        _put_len(out, -1, flexible, _I16)
        return
    data = s.encode()
    _put_len(out, len(data), flexible, _I16)
    out += data


def _put_partition(out: bytearray, p: ProducePartitionResult, version: int, flex: bool) -> None:
    out += _PART_HEAD.pack(p.index, p.error_code, p.base_offset)
    if version >= 2:
        out += struct.pack(">q", p.log_append_time_ms)
    if version >= 5:
        out += struct.pack(">q", p.log_start_offset)
    if version >= 8:
        _put_len(out, len(p.record_errors), flex, _I32)
        for index, message in p.record_errors:
            out += _I32.pack(index)
            _put_string(out, message, flex)
            if flex:
                out.append(0)
        _put_string(out, p.error_message, flex)
    if not flex:
        return
    if p.current_leader is not None and version >= FIRST_LEADER_HINTS:
        out += tagged_fields([(0, current_leader(*p.current_leader))])
    else:
        out.append(0)


def encode_produce_response(
    version: int,
    topics: Sequence[ProduceTopicResult],
    throttle_time_ms: int = 0,
    endpoints: Sequence[NodeEndpoint] = (),
) -> list[Buffer]:
    """Encode a Produce response body (no header) for v0-v13 as a list of buffers.

    v10+: a partition's ``current_leader`` (tag 0) and the response's ``endpoints`` (the
    top-level ``node_endpoints``, tag 0) are written when given (KIP-951; docs in
    ``protocol.leader_hints``); left out, they read as their defaults.
    """
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise KafkaProtocolError(ErrorCode.UNSUPPORTED_VERSION, f"Produce v{version}")
    flex = version >= FIRST_FLEXIBLE
    out = bytearray()
    _put_len(out, len(topics), flex, _I32)
    for t in topics:
        if version >= FIRST_TOPIC_ID:
            out += (t.topic_id or uuid.UUID(int=0)).bytes
        else:
            _put_string(out, t.name, flex)
        _put_len(out, len(t.partitions), flex, _I32)
        for p in t.partitions:
            _put_partition(out, p, version, flex)
        if flex:
            out.append(0)
    if version >= 1:
        out += _I32.pack(throttle_time_ms)
    if endpoints and version >= FIRST_LEADER_HINTS:
        out += tagged_fields([(0, node_endpoints(endpoints))])
    elif flex:
        out.append(0)
    return [bytes(out)]
