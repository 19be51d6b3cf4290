"""ConsumerGroupHeartbeat decisions for one KIP-848 group (no I/O, no timers).

``heartbeat(group, request, topics, config)`` validates the request, applies it (join,
leave, subscription change), bumps the group epoch when membership, subscriptions or the
subscribed topics' metadata changed, recomputes the target assignment when the group
epoch moved past the assignment epoch, reconciles the member (``consumer_reconcile``)
and says what to answer. ``consumer_coordinator`` persists the group and runs the
session and rebalance timers. docs/compatibility.md, KIP-848 consumer groups.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from groupcoord.consumer_assignors import ASSIGNORS
from groupcoord.consumer_model import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    Assignment,
    ConsumerGroupConfig,
    ConsumerGroupState,
    ConsumerMember,
    HeartbeatError,
    HeartbeatRequest,
    MemberState,
    normalized,
)
from groupcoord.consumer_reconcile import reconcile
from groupcoord.consumer_validation import compile_regex, validate
from protocol.errors import ErrorCode


class TopicMeta(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def topic_id(self) -> uuid.UUID: ...
    @property
    def partitions(self) -> int: ...


class TopicView(Protocol):
    """The broker's topics (``broker.topic_table.TopicTable`` satisfies it)."""

    def get(self, name: str) -> TopicMeta | None: ...
    def all(self) -> Iterable[TopicMeta]: ...


@dataclass(slots=True)
class HeartbeatResult:
    error: ErrorCode = ErrorCode.NONE
    message: str | None = None
    member_id: str | None = None
    epoch: int = -1
    assignment: Assignment | None = None
    changed: bool = False  # the group must be persisted
    removed: tuple[str, ...] = ()  # members that left (cancel their timers)


def new_member_id() -> str:
    """A member id like Kafka's (a random UUID, URL-safe base64 without padding)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


# ---- subscriptions and the target assignment ----


def member_topics(
    member: ConsumerMember,
    topics: TopicView,
    authorized: Callable[[str, str, str], bool] | None = None,
) -> dict[uuid.UUID, int]:
    """Topic id -> partitions of every existing topic the member subscribes to. Topics
    its regex matches count only if ``authorized(principal, host, topic)`` (DESCRIBE, as
    Kafka filters regex subscriptions; named topics were checked at the heartbeat)."""
    out: dict[uuid.UUID, int] = {}
    for name in member.topics:
        info = topics.get(name)
        if info is not None:
            out[info.topic_id] = info.partitions
    if member.regex:
        pattern = compile_regex(member.regex)
        host = member.client_host.lstrip("/")
        for info in topics.all():
            if pattern.fullmatch(info.name) and (
                authorized is None or authorized(member.principal, host, info.name)
            ):
                out[info.topic_id] = info.partitions
    return out


def compute_target(
    group: ConsumerGroupState,
    topics: TopicView,
    default: str,
    authorized: Callable[[str, str, str], bool] | None = None,
) -> None:
    """Recompute the target assignment for the current group epoch."""
    subs: dict[str, frozenset[uuid.UUID]] = {}
    partitions: dict[uuid.UUID, int] = {}
    for mid, m in group.members.items():
        mine = member_topics(m, topics, authorized)
        subs[mid] = frozenset(mine)
        partitions.update(mine)
    name = _group_assignor(group, default)
    group.assignor = name
    group.target = {
        mid: normalized(a) for mid, a in ASSIGNORS[name](subs, partitions, group.target).items()
    }
    group.subscribed = partitions
    group.assignment_epoch = group.epoch


def _group_assignor(group: ConsumerGroupState, default: str) -> str:
    """The assignor most members asked for (ties: by name), else the default."""
    votes: dict[str, int] = {}
    for m in group.members.values():
        if m.assignor:
            votes[m.assignor] = votes.get(m.assignor, 0) + 1
    if not votes:
        return default
    return min(votes, key=lambda a: (-votes[a], a))


def subscribed_metadata(
    group: ConsumerGroupState,
    topics: TopicView,
    authorized: Callable[[str, str, str], bool] | None = None,
) -> dict[uuid.UUID, int]:
    out: dict[uuid.UUID, int] = {}
    for m in group.members.values():
        out.update(member_topics(m, topics, authorized))
    return out


# ---- the heartbeat ----


def heartbeat(
    group: ConsumerGroupState,
    req: HeartbeatRequest,
    topics: TopicView,
    config: ConsumerGroupConfig,
    now_ms: int = 0,
) -> HeartbeatResult:
    """Apply one (validated) heartbeat to ``group`` in place."""
    try:
        if req.epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return _leave(group, req, now_ms)
        member, changed = _join_or_find(group, req, config)
    except HeartbeatError as exc:
        return HeartbeatResult(exc.code, exc.message)
    before = (member.epoch, member.state, member.assigned, member.revoking)
    # an ACL change that widens or narrows a regex's topics shows here too
    if subscribed_metadata(group, topics, config.topic_authorized) != group.subscribed:
        group.epoch += 1
        changed = True
    if group.epoch != group.assignment_epoch:
        compute_target(group, topics, config.assignors[0], config.topic_authorized)
        changed = True
    owners = group.partition_owners()
    updated = reconcile(
        member,
        group.assignment_epoch,
        group.target.get(member.member_id, {}),
        lambda t, p: (t, p) in owners,
        req.owned,
    )
    group.members[member.member_id] = updated
    after = (updated.epoch, updated.state, updated.assigned, updated.revoking)
    changed = changed or after != before
    if changed:
        group.state_ts = now_ms
    send = req.full or updated.assigned != before[2]
    return HeartbeatResult(
        member_id=updated.member_id,
        epoch=updated.epoch,
        assignment=updated.assigned if send else None,
        changed=changed,
    )


def _join_or_find(
    group: ConsumerGroupState, req: HeartbeatRequest, config: ConsumerGroupConfig
) -> tuple[ConsumerMember, bool]:
    changed = False
    if req.epoch == JOIN_EPOCH:
        member, changed = _join(group, req, config)
    else:
        found = group.members.get(req.member_id)
        if found is None:
            raise HeartbeatError(
                ErrorCode.UNKNOWN_MEMBER_ID,
                f"Member {req.member_id} is not a member of group {group.group_id}.",
            )
        member = found
        _check_epoch(member, req)
    if req.topics is not None and tuple(req.topics) != member.topics:
        member.topics = tuple(req.topics)
        group.epoch += 1
        changed = True
    if req.principal and req.principal != member.principal:
        member.principal = req.principal  # a regex's topics are filtered for it
        changed = True
    if req.regex is not None and (req.regex or None) != member.regex:
        member.regex = req.regex or None
        group.epoch += 1
        changed = True
    if req.assignor is not None and req.assignor != member.assignor:
        member.assignor = req.assignor
        group.epoch += 1
        changed = True
    if req.rebalance_timeout_ms > 0 and req.rebalance_timeout_ms != member.rebalance_timeout_ms:
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        changed = True
    if req.rack_id is not None and req.rack_id != member.rack_id:
        member.rack_id = req.rack_id
        changed = True
    return member, changed


def _join(
    group: ConsumerGroupState, req: HeartbeatRequest, config: ConsumerGroupConfig
) -> tuple[ConsumerMember, bool]:
    member_id = req.member_id or new_member_id()
    existing = group.members.get(member_id)
    if req.instance_id is not None:
        static = group.by_instance(req.instance_id)
        if static is not None and static.member_id != member_id:
            if static.epoch != STATIC_LEAVE_EPOCH:
                raise HeartbeatError(
                    ErrorCode.UNRELEASED_INSTANCE_ID,
                    f"Static member {static.member_id} with instance id {req.instance_id} "
                    "is present in the group.",
                )
            # the static member comes back under a new member id: it takes over its
            # predecessor's assignment and epoch, the group epoch does not move
            del group.members[static.member_id]
            target = group.target.pop(static.member_id, {})
            static.member_id = member_id
            static.epoch = static.previous_epoch
            group.members[member_id] = static
            group.target[member_id] = target
            _describe_client(static, req)
            return static, True
    if existing is not None:
        if existing.epoch == STATIC_LEAVE_EPOCH:
            existing.epoch = existing.previous_epoch
        _describe_client(existing, req)
        return existing, True
    if len(group.members) >= config.max_size:
        raise HeartbeatError(
            ErrorCode.GROUP_MAX_SIZE_REACHED,
            f"The consumer group has reached its maximum capacity of {config.max_size} members.",
        )
    member = ConsumerMember(member_id=member_id, instance_id=req.instance_id)
    _describe_client(member, req)
    group.members[member_id] = member
    group.epoch += 1
    return member, True


def _describe_client(member: ConsumerMember, req: HeartbeatRequest) -> None:
    member.client_id = req.client_id
    member.client_host = req.client_host
    if req.instance_id is not None:
        member.instance_id = req.instance_id


def _check_epoch(member: ConsumerMember, req: HeartbeatRequest) -> None:
    if req.epoch > member.epoch:
        raise HeartbeatError(
            ErrorCode.FENCED_MEMBER_EPOCH,
            f"The consumer group member has a greater member epoch ({req.epoch}) than the "
            f"one known by the group coordinator ({member.epoch}). The member must abandon "
            "all its partitions and rejoin.",
        )
    if req.epoch < member.epoch:
        # the answer bumping the epoch may have been lost: the previous epoch is fine as
        # long as the member owns no more than it is assigned
        owned = req.owned
        if (
            req.epoch != member.previous_epoch
            or owned is None
            or any(ps - member.assigned.get(t, frozenset()) for t, ps in owned.items())
        ):
            raise HeartbeatError(
                ErrorCode.FENCED_MEMBER_EPOCH,
                f"The consumer group member has a smaller member epoch ({req.epoch}) than "
                f"the one known by the group coordinator ({member.epoch}). The member must "
                "abandon all its partitions and rejoin.",
            )


def _leave(group: ConsumerGroupState, req: HeartbeatRequest, now_ms: int) -> HeartbeatResult:
    member = group.members.get(req.member_id)
    if member is None and req.instance_id is not None:
        member = group.by_instance(req.instance_id)
    if member is None:
        return HeartbeatResult(
            ErrorCode.UNKNOWN_MEMBER_ID,
            f"Member {req.member_id} is not a member of group {group.group_id}.",
        )
    if req.instance_id is not None and member.instance_id not in (None, req.instance_id):
        return HeartbeatResult(
            ErrorCode.FENCED_INSTANCE_ID,
            f"Instance id {req.instance_id} is owned by another member.",
        )
    if req.epoch == STATIC_LEAVE_EPOCH:
        # a static member leaving for a while keeps its partitions until its session
        # times out or it comes back
        if member.epoch != STATIC_LEAVE_EPOCH:
            member.previous_epoch = member.epoch
        member.epoch = STATIC_LEAVE_EPOCH
        group.state_ts = now_ms
        return HeartbeatResult(member_id=member.member_id, epoch=STATIC_LEAVE_EPOCH, changed=True)
    remove_member(group, member.member_id, now_ms)
    return HeartbeatResult(
        member_id=member.member_id, epoch=LEAVE_EPOCH, changed=True, removed=(member.member_id,)
    )


def remove_member(group: ConsumerGroupState, member_id: str, now_ms: int) -> bool:
    """Remove a member (left, session expired or fenced); its partitions become free and
    the group epoch moves so the others get a new target."""
    if group.members.pop(member_id, None) is None:
        return False
    group.target.pop(member_id, None)
    group.epoch += 1
    group.state_ts = now_ms
    return True


def stale_member_error(
    group: ConsumerGroupState, member_id: str, epoch: int
) -> tuple[ErrorCode, str] | None:
    """OffsetCommit/OffsetFetch v9+ member checks (None: the member may go ahead)."""
    member = group.members.get(member_id)
    if member is None:
        return ErrorCode.UNKNOWN_MEMBER_ID, f"Member {member_id} is not in the group."
    if epoch != member.epoch:
        return (
            ErrorCode.STALE_MEMBER_EPOCH,
            f"The member epoch {epoch} is not the current one ({member.epoch}).",
        )
    return None


def topic_names(topics: TopicView, ids: Mapping[uuid.UUID, object]) -> dict[uuid.UUID, str]:
    by_id = {t.topic_id: t.name for t in topics.all()}
    return {tid: by_id[tid] for tid in ids if tid in by_id}


__all__ = [
    "HeartbeatError",
    "HeartbeatRequest",
    "HeartbeatResult",
    "MemberState",
    "TopicView",
    "compile_regex",
    "heartbeat",
    "new_member_id",
    "remove_member",
    "stale_member_error",
    "validate",
]
