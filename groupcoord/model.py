"""Values the group coordinator exchanges with its callers and its store.

Everything here is a frozen, slotted dataclass or an enum: requests coming from the
protocol handlers, results going back to them, and the records the ``GroupStore`` keeps
(group state and committed offsets, serialised as JSON).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, runtime_checkable

from protocol.errors import ErrorCode

#: Upper bound of one member's JoinGroup protocol metadata (sum over its protocols).
#: A larger join is answered with INVALID_REQUEST. Kafka has no explicit limit (only the
#: request size); ours keeps a group's persisted state within etcd's request size limit.
MAX_MEMBER_METADATA_BYTES = 128 * 1024
#: Persisted group state above this size is written without the members' metadata and
#: assignment blobs (DescribeGroups after a reload then shows them empty).
MAX_STATE_BYTES = 1024 * 1024
#: Kafka's offset.metadata.max.bytes default: longer commit metadata gets
#: OFFSET_METADATA_TOO_LARGE.
MAX_OFFSET_METADATA_CHARS = 4096


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """Coordinator settings (filled by the broker from ``BrokerConfig``)."""

    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1_800_000
    initial_rebalance_delay_ms: int = 0
    offsets_retention_minutes: int = 7 * 24 * 60
    #: how often expired offsets / empty groups are looked for
    offsets_retention_check_interval_ms: int = 600_000
    max_member_metadata_bytes: int = MAX_MEMBER_METADATA_BYTES

    @staticmethod
    def from_broker(broker: Any) -> GroupConfig:
        """From a broker (anything with ``.config``) or a ``BrokerConfig`` itself."""
        cfg = getattr(broker, "config", broker)
        return GroupConfig(
            min_session_timeout_ms=cfg.group_min_session_timeout_ms,
            max_session_timeout_ms=cfg.group_max_session_timeout_ms,
            initial_rebalance_delay_ms=cfg.group_initial_rebalance_delay_ms,
            offsets_retention_minutes=cfg.offsets_retention_minutes,
        )


class GroupConflictError(Exception):
    """A compare-and-set on the group's state revision failed (another owner wrote it)."""


@dataclass(frozen=True, slots=True)
class TopicPartition:
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class OffsetRecord:
    """A committed offset, as stored at ``/groups/{group}/offsets/{topic}/{p}``."""

    offset: int
    leader_epoch: int = -1
    metadata: str | None = ""
    commit_ts: int = 0  # unix ms

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "offset": self.offset,
                "leader_epoch": self.leader_epoch,
                "metadata": self.metadata,
                "commit_ts": self.commit_ts,
            },
            separators=(",", ":"),
        ).encode()

    @staticmethod
    def from_json(data: bytes) -> OffsetRecord:
        d = json.loads(data)
        return OffsetRecord(
            int(d["offset"]), int(d.get("leader_epoch", -1)), d.get("metadata"), d["commit_ts"]
        )


@dataclass(frozen=True, slots=True)
class MemberRecord:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    metadata: bytes  # of the selected protocol
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """The group state persisted at ``/groups/{group}/state``."""

    protocol_type: str
    protocol_name: str | None
    generation: int
    leader: str | None
    members: tuple[MemberRecord, ...]
    state_ts: int  # unix ms of the last state change (Empty since, for expiry)

    def to_json(self, with_blobs: bool = True) -> bytes:
        def member(m: MemberRecord) -> dict[str, Any]:
            d: dict[str, Any] = {
                "id": m.member_id,
                "instance_id": m.instance_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "session_timeout_ms": m.session_timeout_ms,
                "rebalance_timeout_ms": m.rebalance_timeout_ms,
            }
            if with_blobs:
                d["metadata"] = base64.b64encode(m.metadata).decode()
                d["assignment"] = base64.b64encode(m.assignment).decode()
            return d

        doc = {
            "protocol_type": self.protocol_type,
            "protocol": self.protocol_name,
            "generation": self.generation,
            "leader": self.leader,
            "members": [member(m) for m in self.members],
            "state_ts": self.state_ts,
        }
        data = json.dumps(doc, separators=(",", ":")).encode()
        if with_blobs and len(data) > MAX_STATE_BYTES:
            return self.to_json(with_blobs=False)
        return data

    @staticmethod
    def from_json(data: bytes) -> GroupRecord:
        d = json.loads(data)
        members = tuple(
            MemberRecord(
                m["id"],
                m.get("instance_id"),
                m.get("client_id", ""),
                m.get("client_host", ""),
                int(m["session_timeout_ms"]),
                int(m["rebalance_timeout_ms"]),
                base64.b64decode(m.get("metadata", "")),
                base64.b64decode(m.get("assignment", "")),
            )
            for m in d.get("members", [])
        )
        return GroupRecord(
            d.get("protocol_type", ""),
            d.get("protocol"),
            int(d["generation"]),
            d.get("leader"),
            members,
            int(d.get("state_ts", 0)),
        )


@dataclass(frozen=True, slots=True)
class StoredGroup:
    record: GroupRecord
    revision: int  # mod_revision of the state key: the compare-and-set token


@runtime_checkable
class GroupStore(Protocol):
    """Where group state and committed offsets live (``broker.group_store.MetaGroupStore``)."""

    async def load_group(self, group_id: str) -> StoredGroup | None: ...

    async def save_group(self, group_id: str, record: GroupRecord, expected_revision: int) -> int:
        """Write the state if its revision is still ``expected_revision`` (0: absent).

        Returns the new revision; raises GroupConflictError otherwise.
        """
        ...

    async def delete_group(self, group_id: str, expected_revision: int) -> None:
        """Delete the state and every offset of the group (CAS as in save_group)."""
        ...

    async def commit_offsets(
        self, group_id: str, offsets: Sequence[tuple[TopicPartition, OffsetRecord]]
    ) -> None:
        """Write all offsets in one transaction (chunked at the store's ops limit)."""
        ...

    async def fetch_offsets(self, group_id: str) -> dict[TopicPartition, OffsetRecord]: ...

    async def delete_offsets(self, group_id: str, partitions: Sequence[TopicPartition]) -> None: ...

    async def list_groups(self) -> list[str]:
        """Every group with a state record or committed offsets."""
        ...


# ---- requests and results exchanged with the handlers ----


@dataclass(frozen=True, slots=True)
class JoinRequest:
    group_id: str
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    require_known_member_id: bool = True  # JoinGroup v4+


@dataclass(frozen=True, slots=True)
class JoinedMember:
    member_id: str
    instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: ErrorCode
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    members: tuple[JoinedMember, ...] = ()
    skip_assignment: bool = False


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class OffsetCommit:
    tp: TopicPartition
    offset: int
    leader_epoch: int = -1
    metadata: str | None = ""


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    error: ErrorCode
    state: str
    protocol_type: str = ""
    protocol_name: str = ""
    members: tuple[MemberDescription, ...] = ()


@dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    protocol_type: str
    state: str
    group_type: str = "classic"  # or "consumer" (KIP-848; ListGroups v5)


@dataclass(frozen=True, slots=True)
class OffsetDeleteResult:
    error: ErrorCode
    partitions: dict[TopicPartition, ErrorCode] = field(default_factory=dict)
