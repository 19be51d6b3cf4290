"""In-memory state of one classic consumer group and its members (no I/O here).

The coordinator (``groupcoord.coordinator``) drives the transitions; this module holds the
data and the pure decisions: protocol support and selection, leader choice, the join
response each member gets, conversion to and from the persisted ``GroupRecord``.
"""

from __future__ import annotations

import asyncio
import struct
from collections import Counter

from groupcoord.model import (
    GroupRecord,
    GroupState,
    JoinedMember,
    JoinResult,
    MemberRecord,
    SyncResult,
)
from protocol.errors import ErrorCode


class Member:
    """One member of a group (dynamic, or static when ``instance_id`` is set)."""

    __slots__ = (
        "member_id",
        "instance_id",
        "client_id",
        "client_host",
        "session_timeout_ms",
        "rebalance_timeout_ms",
        "protocol_type",
        "protocols",
        "assignment",
        "join_future",
        "sync_future",
        "heartbeat_handle",
    )

    def __init__(
        self,
        member_id: str,
        instance_id: str | None,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: tuple[tuple[str, bytes], ...],
    ) -> None:
        self.member_id = member_id
        self.instance_id = instance_id
        self.client_id = client_id
        self.client_host = client_host
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.protocol_type = protocol_type
        self.protocols = protocols
        self.assignment = b""
        self.join_future: asyncio.Future[JoinResult] | None = None
        self.sync_future: asyncio.Future[SyncResult] | None = None
        self.heartbeat_handle: asyncio.TimerHandle | None = None

    @property
    def awaiting_join(self) -> bool:
        return self.join_future is not None and not self.join_future.done()

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_future is not None and not self.sync_future.done()

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata_for(self, protocol: str | None) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""

    def matches(self, protocols: tuple[tuple[str, bytes], ...]) -> bool:
        return self.protocols == protocols

    def vote(self, candidates: set[str]) -> str:
        for name in self.protocol_names():
            if name in candidates:
                return name
        raise ValueError("member supports none of the candidate protocols")

    def complete_join(self, result: JoinResult) -> None:
        fut, self.join_future = self.join_future, None
        if fut is not None and not fut.done():
            fut.set_result(result)

    def complete_sync(self, result: SyncResult) -> None:
        fut, self.sync_future = self.sync_future, None
        if fut is not None and not fut.done():
            fut.set_result(result)

    def cancel_heartbeat(self) -> None:
        if self.heartbeat_handle is not None:
            self.heartbeat_handle.cancel()
            self.heartbeat_handle = None


class Group:
    """One group: state, generation, members, and the timers the coordinator arms."""

    __slots__ = (
        "group_id",
        "state",
        "protocol_type",
        "protocol_name",
        "generation",
        "leader_id",
        "members",
        "static_members",
        "pending_members",
        "pending_sync",
        "revision",
        "state_ts",
        "join_handle",
        "sync_handle",
        "join_not_before",
        "persist_lock",
    )

    def __init__(self, group_id: str, now_ms: int) -> None:
        self.group_id = group_id
        self.state = GroupState.EMPTY
        self.protocol_type = ""
        self.protocol_name: str | None = None
        self.generation = 0
        self.leader_id: str | None = None
        self.members: dict[str, Member] = {}  # insertion order = join order
        self.static_members: dict[str, str] = {}  # instance id -> member id
        self.pending_members: dict[str, asyncio.TimerHandle | None] = {}
        self.pending_sync: set[str] = set()
        self.revision = 0
        self.state_ts = now_ms
        self.join_handle: asyncio.TimerHandle | None = None
        self.sync_handle: asyncio.TimerHandle | None = None
        self.join_not_before = 0.0  # loop time: initial rebalance delay
        self.persist_lock = asyncio.Lock()

    # ---- queries ----

    def is_(self, state: GroupState) -> bool:
        return self.state is state

    def has(self, member_id: str) -> bool:
        return member_id in self.members

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def is_static_fenced(self, member_id: str, instance_id: str | None) -> bool:
        if instance_id is None:
            return False
        known = self.static_members.get(instance_id)
        return known is not None and known != member_id

    def candidate_protocols(self) -> set[str]:
        names: set[str] | None = None
        for m in self.members.values():
            mine = set(m.protocol_names())
            names = mine if names is None else names & mine
        return names or set()

    def supports(self, protocol_type: str, protocols: tuple[tuple[str, bytes], ...]) -> bool:
        names = {n for n, _ in protocols}
        if not self.members:
            return bool(protocol_type) and bool(names)
        return protocol_type == self.protocol_type and bool(names & self.candidate_protocols())

    def select_protocol(self) -> str:
        candidates = self.candidate_protocols()
        votes = Counter(m.vote(candidates) for m in self.members.values())
        best = max(votes.values())
        # deterministic tie-break: the first member's preference order
        first = next(iter(self.members.values()))
        for name in first.protocol_names():
            if votes.get(name) == best:
                return name
        return sorted(n for n, c in votes.items() if c == best)[0]

    def all_joined(self) -> bool:
        return not self.pending_members and all(m.awaiting_join for m in self.members.values())

    def max_rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def join_result_for(self, member: Member, skip_assignment: bool = False) -> JoinResult:
        members: tuple[JoinedMember, ...] = ()
        if self.is_leader(member.member_id):
            members = tuple(
                JoinedMember(m.member_id, m.instance_id, m.metadata_for(self.protocol_name))
                for m in self.members.values()
            )
        return JoinResult(
            ErrorCode.NONE,
            generation=self.generation,
            protocol_type=self.protocol_type,
            protocol_name=self.protocol_name,
            leader=self.leader_id or "",
            member_id=member.member_id,
            members=members,
            skip_assignment=skip_assignment,
        )

    def subscribed_topics(self) -> set[str]:
        """Topics of the members' ``consumer`` subscriptions (for OffsetDelete)."""
        topics: set[str] = set()
        if self.protocol_type != "consumer":
            return topics
        for m in self.members.values():
            topics |= parse_subscription_topics(m.metadata_for(self.protocol_name))
        return topics

    # ---- mutations without I/O ----

    def add(self, member: Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if member.instance_id is not None:
            self.static_members[member.instance_id] = member.member_id
        if self.leader_id is None:
            self.leader_id = member.member_id

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        member.cancel_heartbeat()
        if member.instance_id is not None and self.static_members.get(member.instance_id) == (
            member_id
        ):
            del self.static_members[member.instance_id]
        self.pending_sync.discard(member_id)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        return member

    def replace_static(self, old: Member, new_member_id: str) -> Member:
        """Give a static member's seat to its new incarnation (same instance id)."""
        del self.members[old.member_id]
        self.pending_sync.discard(old.member_id)
        old.cancel_heartbeat()
        old.member_id, old_id = new_member_id, old.member_id
        self.members[new_member_id] = old
        if old.instance_id is not None:
            self.static_members[old.instance_id] = new_member_id
        if self.leader_id == old_id:
            self.leader_id = new_member_id
        return old

    def to_record(self) -> GroupRecord:
        members = tuple(
            MemberRecord(
                m.member_id,
                m.instance_id,
                m.client_id,
                m.client_host,
                m.session_timeout_ms,
                m.rebalance_timeout_ms,
                m.metadata_for(self.protocol_name),
                m.assignment,
            )
            for m in self.members.values()
        )
        return GroupRecord(
            self.protocol_type,
            self.protocol_name,
            self.generation,
            self.leader_id,
            members,
            self.state_ts,
        )

    @staticmethod
    def from_record(group_id: str, record: GroupRecord, revision: int) -> Group:
        group = Group(group_id, record.state_ts)
        group.protocol_type = record.protocol_type
        group.protocol_name = record.protocol_name
        group.generation = record.generation
        group.revision = revision
        for r in record.members:
            member = Member(
                r.member_id,
                r.instance_id,
                r.client_id,
                r.client_host,
                r.session_timeout_ms,
                r.rebalance_timeout_ms,
                record.protocol_type,
                ((record.protocol_name or "", r.metadata),),
            )
            member.assignment = r.assignment
            group.add(member)
        group.leader_id = record.leader if record.leader in group.members else group.leader_id
        group.state = GroupState.STABLE if group.members else GroupState.EMPTY
        return group


def parse_subscription_topics(metadata: bytes) -> set[str]:
    """Topic names from a ConsumerProtocolSubscription (version, [topic], ...)."""
    try:
        pos = 2  # int16 version
        (count,) = struct.unpack_from(">i", metadata, pos)
        pos += 4
        topics = set()
        for _ in range(max(count, 0)):
            (n,) = struct.unpack_from(">h", metadata, pos)
            pos += 2
            topics.add(metadata[pos : pos + n].decode())
            pos += n
        return topics
    except (struct.error, UnicodeDecodeError):
        return set()
