"""Server-side assignors of KIP-848 consumer groups: ``uniform`` and ``range``.

An assignor maps each member's subscription (topic ids) and the subscribed topics'
partition counts to a target assignment, given the previous target (so ``uniform`` can be
sticky). Both are deterministic. Rack-aware placement is not done (no replicas here: any
broker serves any partition). docs/compatibility.md, KIP-848 consumer groups.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping

from groupcoord.consumer_model import Assignment

Subscriptions = Mapping[str, frozenset[uuid.UUID]]  # member id -> subscribed topic ids
Partitions = Mapping[uuid.UUID, int]  # topic id -> partition count
Assignor = Callable[[Subscriptions, Partitions, Mapping[str, Assignment]], dict[str, Assignment]]

TP = tuple[uuid.UUID, int]


def _to_assignment(parts: set[TP]) -> Assignment:
    out: dict[uuid.UUID, set[int]] = {}
    for tid, p in parts:
        out.setdefault(tid, set()).add(p)
    return {tid: frozenset(ps) for tid, ps in out.items()}


def uniform(
    members: Subscriptions, partitions: Partitions, previous: Mapping[str, Assignment]
) -> dict[str, Assignment]:
    """Spread partitions evenly over the members subscribed to them, keeping as many of
    each member's previous partitions as balance allows.

    Every partition of a subscribed topic goes to exactly one subscribed member; when all
    members subscribe to the same topics, member loads differ by at most one.
    """
    if not members:
        return {}
    held: dict[str, set[TP]] = {m: set() for m in members}
    taken: set[TP] = set()
    for m in sorted(members):  # 1. stickiness: keep what is still valid
        for tid, ps in previous.get(m, {}).items():
            if tid not in members[m]:
                continue
            for p in ps:
                tp = (tid, p)
                if p < partitions.get(tid, 0) and tp not in taken:
                    held[m].add(tp)
                    taken.add(tp)
    eligible: dict[uuid.UUID, list[str]] = {
        tid: sorted(m for m, subs in members.items() if tid in subs) for tid in partitions
    }
    free = [
        (tid, p)
        for tid in sorted(partitions, key=lambda t: (len(eligible[t]), str(t)))
        for p in range(partitions[tid])
        if (tid, p) not in taken and eligible[tid]
    ]
    for tp in free:  # 2. most constrained topics first, to the least loaded member
        owner = min(eligible[tp[0]], key=lambda m: (len(held[m]), m))
        held[owner].add(tp)
    _balance(held, eligible)
    return {m: _to_assignment(parts) for m, parts in held.items()}


def _balance(held: dict[str, set[TP]], eligible: Mapping[uuid.UUID, list[str]]) -> None:
    """Move one partition at a time from the heaviest member that has a movable one to
    its lightest eligible member, while that narrows a gap of two or more (3. balance
    after stickiness: only surplus partitions move)."""
    while True:
        for src in sorted(held, key=lambda m: (-len(held[m]), m)):
            move = _movable(src, held, eligible)
            if move is not None:
                tp, dst = move
                held[src].discard(tp)
                held[dst].add(tp)
                break
        else:
            return


def _movable(
    src: str, held: dict[str, set[TP]], eligible: Mapping[uuid.UUID, list[str]]
) -> tuple[TP, str] | None:
    for tp in sorted(held[src], key=lambda x: (str(x[0]), -x[1])):
        dst = min(eligible[tp[0]], key=lambda m: (len(held[m]), m))
        if len(held[dst]) + 1 < len(held[src]):
            return tp, dst
    return None


def range_(
    members: Subscriptions, partitions: Partitions, previous: Mapping[str, Assignment]
) -> dict[str, Assignment]:
    """Per topic, contiguous ranges of partitions to the subscribed members in member-id
    order, the first ``partitions % members`` getting one more (co-partitioned topics
    land on the same member)."""
    out: dict[str, dict[uuid.UUID, frozenset[int]]] = {m: {} for m in members}
    for tid, count in partitions.items():
        subs = sorted(m for m, topics in members.items() if tid in topics)
        if not subs:
            continue
        base, extra = divmod(count, len(subs))
        start = 0
        for i, m in enumerate(subs):
            n = base + (1 if i < extra else 0)
            if n:
                out[m][tid] = frozenset(range(start, start + n))
            start += n
    return out


ASSIGNORS: dict[str, Assignor] = {"uniform": uniform, "range": range_}
