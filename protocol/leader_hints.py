"""KIP-951 leader hints: the tagged fields that name a partition's current leader in a
Produce (v10+) or Fetch (v12+) response, and the endpoints of those leaders (Produce v10+,
Fetch v16+), so that a client told NOT_LEADER_OR_FOLLOWER goes to the new leader without
a Metadata round trip first.

- ``CurrentLeader`` (``LeaderIdAndEpoch``): ``int32 leader_id, int32 leader_epoch``, then
  the struct's own (empty) tagged fields. Partition tag 0 in Produce, 1 in Fetch.
- ``NodeEndpoints``: a compact array of ``int32 node_id, compact string host, int32 port,
  compact nullable string rack`` (each with empty tagged fields). Top-level tag 0 in both.

Only the encoders of flexible versions call these; no I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

from protocol.frame import uvarint

_LEADER = struct.Struct(">ii")
_I32 = struct.Struct(">i")


class NodeEndpoint(NamedTuple):
    node_id: int
    host: str
    port: int
    rack: str | None = None


def _compact_string(s: str | None) -> bytes:
    if s is None:
        return b"\x00"
    data = s.encode()
    return uvarint(len(data) + 1) + data


def tagged_fields(fields: Sequence[tuple[int, bytes]]) -> bytes:
    """A tagged-field section: the count, then each ``(tag, payload)`` in tag order."""
    out = bytearray(uvarint(len(fields)))
    for tag, payload in sorted(fields):
        out += uvarint(tag) + uvarint(len(payload)) + payload
    return bytes(out)


def current_leader(leader_id: int, leader_epoch: int) -> bytes:
    """The payload of a ``CurrentLeader`` tagged field."""
    return _LEADER.pack(leader_id, leader_epoch) + b"\x00"


def node_endpoints(endpoints: Sequence[NodeEndpoint]) -> bytes:
    """The payload of a ``NodeEndpoints`` tagged field."""
    out = bytearray(uvarint(len(endpoints) + 1))
    for e in endpoints:
        out += _I32.pack(e.node_id) + _compact_string(e.host) + _I32.pack(e.port)
        out += _compact_string(e.rack) + b"\x00"
    return bytes(out)
