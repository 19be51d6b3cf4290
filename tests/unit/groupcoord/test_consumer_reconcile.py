"""The KIP-848 heartbeat state machine against simulated clients (hypothesis).

Clients join, heartbeat, leave, time out and topics grow, in any order. A client keeps
consuming what it was given until its next heartbeat, where it reports having dropped
what was taken away (as real clients do: revoke, then report). Checked after every step:
no partition is held by two members in the coordinator's view, and no two clients
consume the same partition at once. At the end, clients heartbeating repeatedly
converge: the group is Stable and every partition is consumed by exactly one client.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from groupcoord.consumer_group import HeartbeatRequest, heartbeat, remove_member
from groupcoord.consumer_model import (
    Assignment,
    ConsumerGroupConfig,
    ConsumerGroupState,
    ConsumerMember,
    MemberState,
)
from groupcoord.consumer_reconcile import reconcile
from protocol.errors import ErrorCode


@dataclass(frozen=True)
class Topic:
    name: str
    topic_id: uuid.UUID
    partitions: int


class Topics:
    def __init__(self) -> None:
        self.by_name: dict[str, Topic] = {}

    def get(self, name: str) -> Topic | None:
        return self.by_name.get(name)

    def all(self) -> list[Topic]:
        return list(self.by_name.values())

    def add(self, name: str, partitions: int) -> None:
        old = self.by_name.get(name)
        tid = old.topic_id if old else uuid.uuid5(uuid.NAMESPACE_DNS, name)
        self.by_name[name] = Topic(name, tid, partitions)


@dataclass
class Client:
    member_id: str = ""
    epoch: int = 0
    instance_id: str | None = None
    owned: set[tuple[uuid.UUID, int]] = field(default_factory=set)
    consuming: set[tuple[uuid.UUID, int]] = field(default_factory=set)


def _flat(a: Assignment) -> set[tuple[uuid.UUID, int]]:
    return {(t, p) for t, ps in a.items() for p in ps}


def _group(owned: set[tuple[uuid.UUID, int]]) -> Assignment:
    out: dict[uuid.UUID, set[int]] = {}
    for t, p in owned:
        out.setdefault(t, set()).add(p)
    return {t: frozenset(ps) for t, ps in out.items()}


CONFIG = ConsumerGroupConfig()


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.topics = Topics()
        self.group = ConsumerGroupState("g")
        self.clients: list[Client] = []

    @initialize(
        a=st.integers(min_value=1, max_value=8),
        b=st.integers(min_value=0, max_value=6),
        assignor=st.sampled_from(["uniform", "range"]),
    )
    def setup(self, a: int, b: int, assignor: str) -> None:
        self.topics.add("a", a)
        if b:
            self.topics.add("b", b)
        self.assignor = assignor

    def _beat(self, c: Client) -> None:
        # the client finished revoking what its last answer took away, then reports
        c.consuming = set(c.owned)
        req = HeartbeatRequest(
            group_id="g",
            member_id=c.member_id,
            epoch=c.epoch,
            rebalance_timeout_ms=30_000 if c.epoch == 0 else -1,
            topics=("a", "b") if c.epoch == 0 else None,
            assignor=self.assignor if c.epoch == 0 else None,
            owned=_group(c.owned),
            instance_id=c.instance_id if c.epoch == 0 else None,
        )
        res = heartbeat(self.group, req, self.topics, CONFIG)
        assert res.error is ErrorCode.NONE, res.message
        c.member_id, c.epoch = res.member_id or "", res.epoch
        if res.assignment is not None:
            new = _flat(res.assignment)
            c.owned = new
            c.consuming |= new  # still draining the revoked ones until the next beat

    @rule()
    def join(self) -> None:
        if len(self.clients) < 6:
            self.joined = getattr(self, "joined", 0) + 1
            c = Client(member_id=f"client-{self.joined}")  # client-generated, as Kafka 4
            self.clients.append(c)
            self._beat(c)

    @rule(i=st.integers(min_value=0, max_value=5))
    def beat(self, i: int) -> None:
        if self.clients:
            self._beat(self.clients[i % len(self.clients)])

    @rule(i=st.integers(min_value=0, max_value=5))
    def leave(self, i: int) -> None:
        if self.clients:
            c = self.clients.pop(i % len(self.clients))
            res = heartbeat(self.group, HeartbeatRequest("g", c.member_id, -1), self.topics, CONFIG)
            assert res.error is ErrorCode.NONE and res.epoch == -1

    @rule(i=st.integers(min_value=0, max_value=5))
    def static_member_restarts(self, i: int) -> None:
        """A static member leaves for a while (epoch -2, it stops consuming) and a new
        process with the same instance id and a new member id takes its place."""
        if not self.clients:
            return
        old = self.clients.pop(i % len(self.clients))
        instance = old.instance_id or f"static-{old.member_id}"
        if old.instance_id is None:  # becomes static first (a rejoin with an instance id)
            old.instance_id, old.epoch, old.owned, old.consuming = instance, 0, set(), set()
            self.clients.append(old)
            self._beat(old)
            self.clients.remove(old)
        req = HeartbeatRequest("g", old.member_id, -2, instance_id=instance)
        res = heartbeat(self.group, req, self.topics, CONFIG)
        assert res.error is ErrorCode.NONE and res.epoch == -2
        self.joined = getattr(self, "joined", 0) + 1
        new = Client(member_id=f"client-{self.joined}", instance_id=instance)
        self.clients.append(new)
        self._beat(new)

    @rule(i=st.integers(min_value=0, max_value=5))
    def session_expires(self, i: int) -> None:
        if self.clients:
            c = self.clients.pop(i % len(self.clients))
            assert remove_member(self.group, c.member_id, 0)

    @rule(extra=st.integers(min_value=1, max_value=3), name=st.sampled_from(["a", "b"]))
    def grow_topic(self, extra: int, name: str) -> None:
        t = self.topics.get(name)
        self.topics.add(name, (t.partitions if t else 0) + extra)

    @invariant()
    def coordinator_never_double_assigns(self) -> None:
        seen: set[tuple[uuid.UUID, int]] = set()
        for m in self.group.members.values():
            mine = set(m.owns())
            assert not (mine & seen)
            seen |= mine

    @invariant()
    def clients_never_share_a_partition(self) -> None:
        seen: set[tuple[uuid.UUID, int]] = set()
        for c in self.clients:
            assert not (c.consuming & seen), "two clients consume one partition"
            seen |= c.consuming

    def teardown(self) -> None:
        if not self.clients:
            return
        for _ in range(8):
            for c in self.clients:
                self._beat(c)
        assert self.group.state_name() == "Stable"
        every = {(t.topic_id, p) for t in self.topics.all() for p in range(t.partitions)}
        owned = [c.owned for c in self.clients]
        assert set().union(*owned) == every
        assert sum(len(o) for o in owned) == len(every)


TestGroupMachine = GroupMachine.TestCase
TestGroupMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


# ---- the reconciliation steps, one by one ----

T = uuid.uuid4()


def _member(**kw: object) -> ConsumerMember:
    m = ConsumerMember(member_id="m", epoch=1)
    for k, v in kw.items():
        setattr(m, k, v)
    return m


def test_revocation_comes_before_the_new_epoch() -> None:
    m = _member(assigned={T: frozenset({0, 1, 2})})
    nxt = reconcile(m, 2, {T: frozenset({0})}, lambda t, p: False, {T: frozenset({0, 1, 2})})
    assert nxt.state is MemberState.UNREVOKED_PARTITIONS and nxt.epoch == 1
    assert nxt.assigned == {T: frozenset({0})} and nxt.revoking == {T: frozenset({1, 2})}
    # still reported as owned: no progress
    same = reconcile(nxt, 2, {T: frozenset({0})}, lambda t, p: False, {T: frozenset({0, 1})})
    assert same is nxt
    # reported as revoked: moves on to the target epoch
    done = reconcile(nxt, 2, {T: frozenset({0})}, lambda t, p: False, {T: frozenset({0})})
    assert done.state is MemberState.STABLE and done.epoch == 2 and done.previous_epoch == 1
    assert done.revoking == {}


def test_partitions_held_elsewhere_stay_unreleased() -> None:
    m = _member()
    held = {(T, 1)}
    nxt = reconcile(m, 2, {T: frozenset({0, 1})}, lambda t, p: (t, p) in held, {})
    assert nxt.state is MemberState.UNRELEASED_PARTITIONS and nxt.epoch == 2
    assert nxt.assigned == {T: frozenset({0})}
    held.clear()
    freed = reconcile(nxt, 2, {T: frozenset({0, 1})}, lambda t, p: False, {T: frozenset({0})})
    assert freed.state is MemberState.STABLE and freed.assigned == {T: frozenset({0, 1})}


def test_unreported_ownership_counts_as_owned() -> None:
    m = _member(assigned={T: frozenset({0, 1})})
    nxt = reconcile(m, 2, {T: frozenset({0})}, lambda t, p: False, None)
    assert nxt.state is MemberState.UNREVOKED_PARTITIONS
