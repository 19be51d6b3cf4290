"""Zero-copy Fetch response encoding (v4-v18) as a list of buffers.

The record buffers of each partition are placed in the output list as the very objects
given (never joined or copied); the bytes between them (counts, offsets, lengths) are
packed into small ``bytes`` chunks. v12+ is flexible; v13+ identifies topics by UUID.
KIP-951: a partition's ``current_leader`` (v12+, tag 1) and the response's
``node_endpoints`` (v16+, tag 0) are written when given (``protocol.leader_hints``); the
tagged fields ``diverging_epoch`` and ``snapshot_id`` are left at their defaults and
therefore not written.

A partition without data gets an empty (length 0), not a null, records field, as Kafka
brokers send.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from protocol.errors import ErrorCode, KafkaProtocolError
from protocol.frame import Buffer
from protocol.frame import uvarint as _uvarint
from protocol.leader_hints import NodeEndpoint, current_leader, node_endpoints, tagged_fields

MIN_VERSION = 4
MAX_VERSION = 18
FIRST_FLEXIBLE = 12
FIRST_TOPIC_ID = 13
FIRST_NODE_ENDPOINTS = 16

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_TOP_V7 = struct.Struct(">ihi")  # throttle_time_ms, error_code, session_id
_PART_V4 = struct.Struct(">ihqq")  # index, error_code, high_watermark, last_stable_offset
_I64 = struct.Struct(">q")
_ABORTED = struct.Struct(">qq")
_ZERO_UUID = uuid.UUID(int=0)


class AbortedTransaction(NamedTuple):
    producer_id: int
    first_offset: int


@dataclass(frozen=True, slots=True)
class FetchPartitionData:
    index: int
    error_code: int = 0
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    aborted_transactions: Sequence[tuple[int, int]] | None = None
    preferred_read_replica: int = -1
    records: Sequence[Buffer] = ()  # concatenated on the wire, passed through uncopied
    # KIP-951 (v12+): (leader id, leader epoch) of a partition that moved
    current_leader: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class FetchTopicData:
    name: str
    topic_id: uuid.UUID
    partitions: list[FetchPartitionData]


@dataclass(frozen=True, slots=True)
class FetchResponseData:
    throttle_time_ms: int = 0
    error_code: int = 0
    session_id: int = 0
    topics: list[FetchTopicData] = field(default_factory=list)
    # KIP-951 (v16+): where the partitions' ``current_leader`` brokers are reached
    node_endpoints: Sequence[NodeEndpoint] = ()


def _nbytes(buf: Buffer) -> int:
    return buf.nbytes if isinstance(buf, memoryview) else len(buf)


class _Writer:
    """Accumulates fixed fields in a bytearray; record buffers are appended as-is."""

    __slots__ = ("out", "cur", "flexible")

    def __init__(self, flexible: bool) -> None:
        self.out: list[Buffer] = []
        self.cur = bytearray()
        self.flexible = flexible

    def length(self, n: int, wide: struct.Struct = _I32) -> None:
        """A (nullable, -1 = null) length: compact when flexible, else ``wide``."""
        self.cur += _uvarint(n + 1) if self.flexible else wide.pack(n)

    def string(self, s: str) -> None:
        data = s.encode()
        self.length(len(data), _I16)
        self.cur += data

    def tags(self) -> None:
        if self.flexible:
            self.cur.append(0)

    def records(self, buffers: Sequence[Buffer]) -> None:
        self.length(sum(_nbytes(b) for b in buffers))
        if buffers:
            self.out.append(bytes(self.cur))
            self.cur.clear()
            self.out.extend(buffers)

    def finish(self) -> list[Buffer]:
        if self.cur:
            self.out.append(bytes(self.cur))
        return self.out


def _write_partition(w: _Writer, p: FetchPartitionData, version: int) -> None:
    w.cur += _PART_V4.pack(p.index, p.error_code, p.high_watermark, p.last_stable_offset)
    if version >= 5:
        w.cur += _I64.pack(p.log_start_offset)
    aborted = p.aborted_transactions
    if aborted is None:
        w.length(-1)
    else:
        w.length(len(aborted))
        for producer_id, first_offset in aborted:
            w.cur += _ABORTED.pack(producer_id, first_offset)
            w.tags()
    if version >= 11:
        w.cur += _I32.pack(p.preferred_read_replica)
    w.records(p.records)
    if p.current_leader is not None and w.flexible:
        w.cur += tagged_fields([(1, current_leader(*p.current_leader))])
    else:
        w.tags()


def encode_fetch_response(version: int, resp: FetchResponseData) -> list[Buffer]:
    """Encode a Fetch response body (no response header) for v4-v18 as a list of buffers.

    Raises ``KafkaProtocolError(UNSUPPORTED_VERSION)`` outside v4-v18.
    """
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise KafkaProtocolError(ErrorCode.UNSUPPORTED_VERSION, f"Fetch v{version}")
    w = _Writer(version >= FIRST_FLEXIBLE)
    if version >= 7:
        w.cur += _TOP_V7.pack(resp.throttle_time_ms, resp.error_code, resp.session_id)
    else:
        w.cur += _I32.pack(resp.throttle_time_ms)
    w.length(len(resp.topics))
    for topic in resp.topics:
        if version >= FIRST_TOPIC_ID:
            w.cur += (topic.topic_id or _ZERO_UUID).bytes
        else:
            w.string(topic.name)
        w.length(len(topic.partitions))
        for p in topic.partitions:
            _write_partition(w, p, version)
        w.tags()
    if resp.node_endpoints and version >= FIRST_NODE_ENDPOINTS:
        w.cur += tagged_fields([(0, node_endpoints(resp.node_endpoints))])
    else:
        w.tags()
    return w.finish()
