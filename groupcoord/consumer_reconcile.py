"""Reconciling one KIP-848 member towards its target assignment (no I/O).

A member moves to the target epoch in steps, as in Kafka's group coordinator: partitions
it must give up are first *pending revocation* (it keeps its epoch until a heartbeat no
longer lists them as owned); partitions it gains are assigned only once no other member
holds them (assigned or pending revocation), otherwise they stay *unreleased* until
freed. So no partition is ever held by two members at once
(tests/unit/groupcoord/test_consumer_reconcile.py checks that property).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable

from groupcoord.consumer_model import Assignment, ConsumerMember, MemberState

#: (topic id, partition) -> whether a member other than the one reconciled holds it, or
#: this member holds it pending revocation
IsHeld = Callable[[uuid.UUID, int], bool]


def owns_any(owned: Assignment | None, parts: Assignment) -> bool:
    """Whether the partitions a member reported owning include any of ``parts`` (an
    unreported set, None, counts as still owning them)."""
    if owned is None:
        return True
    return any(owned.get(tid, frozenset()) & ps for tid, ps in parts.items())


def reconcile(
    member: ConsumerMember,
    target_epoch: int,
    target: Assignment,
    held: IsHeld,
    owned: Assignment | None,
) -> ConsumerMember:
    """The member's next state (``member`` itself when it cannot move on yet)."""
    if member.state is MemberState.STABLE:
        if member.epoch == target_epoch:
            return member
        return _next(member, member.epoch, target_epoch, target, held, owned)
    if member.state is MemberState.UNREVOKED_PARTITIONS:
        if owns_any(owned, member.revoking):
            return member
        return _next(member, member.epoch + 1, target_epoch, target, held, owned)
    return _next(member, member.epoch, target_epoch, target, held, owned)


def _next(
    member: ConsumerMember,
    epoch: int,
    target_epoch: int,
    target: Assignment,
    held: IsHeld,
    owned: Assignment | None,
) -> ConsumerMember:
    assigned: dict[uuid.UUID, frozenset[int]] = {}
    revoking: dict[uuid.UUID, frozenset[int]] = {}
    pending: dict[uuid.UUID, frozenset[int]] = {}
    unreleased = False
    for tid in set(target) | set(member.assigned):
        want = target.get(tid, frozenset())
        have = member.assigned.get(tid, frozenset())
        keep = have & want
        give = have - keep
        gain = {p for p in want - keep if not held(tid, p)}
        unreleased = unreleased or len(gain) < len(want - keep)
        if keep:
            assigned[tid] = keep
        if give:
            revoking[tid] = give
        if gain:
            pending[tid] = frozenset(gain)
    if revoking and owns_any(owned, revoking):
        return _with(member, MemberState.UNREVOKED_PARTITIONS, epoch, assigned, revoking)
    for tid, ps in pending.items():
        assigned[tid] = assigned.get(tid, frozenset()) | ps
    state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
    return _with(member, state, target_epoch, assigned, {})


def _with(
    member: ConsumerMember,
    state: MemberState,
    epoch: int,
    assigned: Assignment,
    revoking: Assignment,
) -> ConsumerMember:
    previous = member.epoch if epoch != member.epoch else member.previous_epoch
    return dataclasses.replace(
        member,
        state=state,
        epoch=epoch,
        previous_epoch=previous,
        assigned=assigned,
        revoking=revoking,
    )
