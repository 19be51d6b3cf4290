"""State of one KIP-848 consumer group (``group.protocol=consumer``) and its codec.

No I/O here: ``consumer_group.py`` decides the heartbeats, ``consumer_coordinator.py``
persists the group at ``/groups/{group}/consumer`` (``broker.meta.schema``) with
compare-and-set, as the classic coordinator does with ``/state``. Assignments are keyed
by topic id (a re-created topic is a different topic). docs/architecture.md, consumer
groups (KIP-848).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from protocol.errors import ErrorCode

#: topic id -> partitions
Assignment = dict[uuid.UUID, frozenset[int]]

#: member epochs with a meaning in a ConsumerGroupHeartbeat request
JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2

#: a member's subscription: at most this many topic names, this many bytes of names,
#: and a regex of at most this many characters (Kafka limits only the request size;
#: these keep the persisted group within the metadata store's request limit)
MAX_SUBSCRIBED_TOPICS = 10_000
MAX_SUBSCRIPTION_BYTES = 128 * 1024
MAX_REGEX_CHARS = 4096


class MemberState(Enum):
    """Where a member is in reconciling towards its target assignment (Kafka's names)."""

    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"


class MigrationPolicy(Enum):
    """``group.consumer.migration.policy``: which conversions between a classic and a
    consumer group are allowed (docs/compatibility.md: only groups without members are
    converted here)."""

    DISABLED = "disabled"
    UPGRADE = "upgrade"
    DOWNGRADE = "downgrade"
    BIDIRECTIONAL = "bidirectional"

    @property
    def upgrade(self) -> bool:
        return self in (MigrationPolicy.UPGRADE, MigrationPolicy.BIDIRECTIONAL)

    @property
    def downgrade(self) -> bool:
        return self in (MigrationPolicy.DOWNGRADE, MigrationPolicy.BIDIRECTIONAL)


@dataclass(frozen=True, slots=True)
class ConsumerGroupConfig:
    """Kafka's ``group.consumer.*`` settings."""

    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 5_000
    max_size: int = 2**31 - 1
    assignors: tuple[str, ...] = ("uniform", "range")  # the first is the default
    migration_policy: MigrationPolicy = MigrationPolicy.BIDIRECTIONAL
    #: (principal, host, topic) -> may the member DESCRIBE the topic; topics a member's
    #: regex matches are filtered by it (None: no authorizer, every topic)
    topic_authorized: Callable[[str, str, str], bool] | None = None


def consumer_group_config(
    cfg: Any, topic_authorized: Callable[[str, str, str], bool] | None = None
) -> ConsumerGroupConfig:
    """From a ``BrokerConfig`` (its ``group_consumer_*`` fields)."""
    return ConsumerGroupConfig(
        session_timeout_ms=cfg.group_consumer_session_timeout_ms,
        heartbeat_interval_ms=cfg.group_consumer_heartbeat_interval_ms,
        migration_policy=MigrationPolicy(cfg.group_consumer_migration_policy.lower()),
        topic_authorized=topic_authorized,
    )


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    group_id: str
    member_id: str
    epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    topics: tuple[str, ...] | None = None
    regex: str | None = None
    assignor: str | None = None
    owned: Assignment | None = None
    client_id: str = ""
    client_host: str = ""
    principal: str = ""  # the authenticated principal, e.g. "User:alice"

    @property
    def full(self) -> bool:
        """A full request (join, or every field set): it is answered with the assignment."""
        return self.epoch == JOIN_EPOCH or (
            self.rebalance_timeout_ms != -1 and self.topics is not None and self.owned is not None
        )


class HeartbeatError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(slots=True)
class ConsumerMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    epoch: int = 0
    previous_epoch: int = -1
    state: MemberState = MemberState.STABLE
    rebalance_timeout_ms: int = 300_000
    topics: tuple[str, ...] = ()
    regex: str | None = None
    principal: str = ""  # its regex matches only topics this principal may DESCRIBE
    assignor: str | None = None
    assigned: Assignment = field(default_factory=dict)
    revoking: Assignment = field(default_factory=dict)

    def owns(self) -> Iterable[tuple[uuid.UUID, int]]:
        """Every partition this member holds: assigned or still being revoked."""
        for part in (self.assigned, self.revoking):
            for tid, parts in part.items():
                for p in parts:
                    yield tid, p

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.member_id,
            "instance_id": self.instance_id,
            "rack": self.rack_id,
            "client_id": self.client_id,
            "client_host": self.client_host,
            "epoch": self.epoch,
            "prev_epoch": self.previous_epoch,
            "state": self.state.value,
            "rebalance_timeout_ms": self.rebalance_timeout_ms,
            "topics": list(self.topics),
            "regex": self.regex,
            "principal": self.principal,
            "assignor": self.assignor,
            "assigned": assignment_to_json(self.assigned),
            "revoking": assignment_to_json(self.revoking),
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> ConsumerMember:
        return ConsumerMember(
            member_id=str(d["id"]),
            instance_id=d.get("instance_id"),
            rack_id=d.get("rack"),
            client_id=str(d.get("client_id", "")),
            client_host=str(d.get("client_host", "")),
            epoch=int(d["epoch"]),
            previous_epoch=int(d.get("prev_epoch", -1)),
            state=MemberState(d.get("state", "stable")),
            rebalance_timeout_ms=int(d.get("rebalance_timeout_ms", 300_000)),
            topics=tuple(d.get("topics") or ()),
            regex=d.get("regex"),
            principal=str(d.get("principal", "")),
            assignor=d.get("assignor"),
            assigned=assignment_from_json(d.get("assigned") or {}),
            revoking=assignment_from_json(d.get("revoking") or {}),
        )


@dataclass(slots=True)
class ConsumerGroupState:
    """The persisted part of a consumer group."""

    group_id: str
    epoch: int = 0  # the group epoch: bumped on every membership/subscription change
    assignment_epoch: int = 0  # the epoch the target assignment was computed for
    assignor: str = ""
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    target: dict[str, Assignment] = field(default_factory=dict)
    #: topic id -> partition count of every topic the members subscribe to, as the
    #: target assignment last saw them (a change bumps the group epoch)
    subscribed: dict[uuid.UUID, int] = field(default_factory=dict)
    state_ts: int = 0  # unix ms of the last change (Empty since, for offset expiry)

    def state_name(self) -> str:
        """Kafka's consumer-group state: Empty, Assigning, Reconciling or Stable."""
        if not self.members:
            return "Empty"
        if self.epoch != self.assignment_epoch:
            return "Assigning"
        for m in self.members.values():
            if m.epoch != self.assignment_epoch or m.state is not MemberState.STABLE:
                return "Reconciling"
        return "Stable"

    def by_instance(self, instance_id: str) -> ConsumerMember | None:
        for m in self.members.values():
            if m.instance_id == instance_id:
                return m
        return None

    def partition_owners(self) -> dict[tuple[uuid.UUID, int], str]:
        """(topic id, partition) -> the member holding it (assigned or revoking)."""
        owners: dict[tuple[uuid.UUID, int], str] = {}
        for m in self.members.values():
            for tp in m.owns():
                owners[tp] = m.member_id
        return owners

    def to_json(self) -> bytes:
        doc = {
            "type": "consumer",
            "epoch": self.epoch,
            "assignment_epoch": self.assignment_epoch,
            "assignor": self.assignor,
            "members": [m.to_dict() for m in self.members.values()],
            "target": {mid: assignment_to_json(a) for mid, a in self.target.items()},
            "subscribed": {str(t): n for t, n in self.subscribed.items()},
            "state_ts": self.state_ts,
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @staticmethod
    def from_json(group_id: str, data: bytes) -> ConsumerGroupState:
        d = json.loads(data)
        members = [ConsumerMember.from_dict(m) for m in d.get("members", [])]
        return ConsumerGroupState(
            group_id=group_id,
            epoch=int(d["epoch"]),
            assignment_epoch=int(d.get("assignment_epoch", 0)),
            assignor=str(d.get("assignor", "")),
            members={m.member_id: m for m in members},
            target={
                str(mid): assignment_from_json(a) for mid, a in (d.get("target") or {}).items()
            },
            subscribed={uuid.UUID(t): int(n) for t, n in (d.get("subscribed") or {}).items()},
            state_ts=int(d.get("state_ts", 0)),
        )


def assignment_to_json(a: Assignment) -> dict[str, list[int]]:
    return {str(t): sorted(ps) for t, ps in a.items() if ps}


def assignment_from_json(d: Mapping[str, Iterable[int]]) -> Assignment:
    return {uuid.UUID(t): frozenset(int(p) for p in ps) for t, ps in d.items() if ps}


def normalized(a: Mapping[uuid.UUID, Iterable[int]]) -> Assignment:
    """A copy without empty topics (so equal assignments compare equal)."""
    return {t: frozenset(ps) for t, ps in a.items() if ps}
