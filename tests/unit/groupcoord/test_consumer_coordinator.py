"""The KIP-848 coordinator over the real embedded metadata store: persistence across
coordinator instances, static membership, session and rebalance timeouts, conversions
between classic and consumer groups, admin operations."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from groupcoord import GroupCoordinator
from groupcoord.consumer_coordinator import ConsumerGroupCoordinator
from groupcoord.consumer_group import HeartbeatRequest, HeartbeatResult
from groupcoord.consumer_model import Assignment, ConsumerGroupConfig
from protocol.errors import ErrorCode
from tests.unit.groupcoord.conftest import FAST, Env, full_join


@dataclass(frozen=True)
class Topic:
    name: str
    topic_id: uuid.UUID
    partitions: int


class Topics:
    def __init__(self, **counts: int) -> None:
        self.t = {n: Topic(n, uuid.uuid5(uuid.NAMESPACE_DNS, n), c) for n, c in counts.items()}

    def get(self, name: str) -> Topic | None:
        return self.t.get(name)

    def all(self) -> list[Topic]:
        return list(self.t.values())


TOPICS = Topics(t=6)
TID = TOPICS.t["t"].topic_id


_made: list[GroupCoordinator] = []


@pytest.fixture(autouse=True)
async def _stop_coordinators() -> AsyncIterator[None]:
    yield
    while _made:
        await _made.pop().stop()


def make(env: Env, **cfg: object) -> GroupCoordinator:
    coord = GroupCoordinator(
        env.store,
        FAST,
        clock_ms=env.clock,
        consumer_topics=TOPICS,
        consumer_config=ConsumerGroupConfig(**cfg),  # type: ignore[arg-type]
    )
    _made.append(coord)
    return coord


def cg(coord: GroupCoordinator) -> ConsumerGroupCoordinator:
    assert coord.consumer is not None
    return coord.consumer


def req(member: str, epoch: int, owned: Assignment | None = None, **kw: object) -> HeartbeatRequest:
    if epoch == 0:
        kw.setdefault("topics", ("t",))
        kw.setdefault("rebalance_timeout_ms", 30_000)
        owned = {}
    return HeartbeatRequest("g", member, epoch, owned=owned, **kw)  # type: ignore[arg-type]


def parts(res: HeartbeatResult) -> frozenset[int]:
    assert res.assignment is not None
    return res.assignment.get(TID, frozenset())


async def test_group_state_survives_a_new_coordinator(env: Env) -> None:
    first = make(env)
    a = await cg(first).heartbeat(req("a", 0))
    assert a.error is ErrorCode.NONE and parts(a) == frozenset(range(6))
    await first.stop()
    second = make(env)
    again = await cg(second).heartbeat(req("a", a.epoch, {TID: parts(a)}))
    assert again.error is ErrorCode.NONE and again.epoch == a.epoch  # not fenced
    stale = await cg(second).heartbeat(req("a", a.epoch + 1))
    assert stale.error is ErrorCode.FENCED_MEMBER_EPOCH
    await second.stop()


async def test_second_member_gets_partitions_only_after_revocation(env: Env) -> None:
    c = cg(make(env))
    a = await c.heartbeat(req("a", 0))
    b = await c.heartbeat(req("b", 0))
    assert b.error is ErrorCode.NONE and parts(b) == frozenset()  # a still holds them all
    a2 = await c.heartbeat(req("a", a.epoch, {TID: parts(a)}))
    assert len(parts(a2)) == 3 and a2.epoch == a.epoch  # asked to revoke 3, same epoch
    b2 = await c.heartbeat(req("b", b.epoch, {}))
    assert b2.assignment is None or parts(b2) == frozenset()  # not released yet
    a3 = await c.heartbeat(req("a", a2.epoch, {TID: parts(a2)}))
    assert a3.epoch > a2.epoch
    b3 = await c.heartbeat(req("b", b2.epoch, {}))
    assert parts(b3) == frozenset(range(6)) - parts(a2)


async def test_static_member_rejoins_with_its_partitions(env: Env) -> None:
    c = cg(make(env))
    a = await c.heartbeat(req("a1", 0, instance_id="i"))
    b = await c.heartbeat(req("b", 0))
    mine = parts(a)
    for _ in range(3):  # a revokes half, b gets it
        a = await c.heartbeat(req("a1", a.epoch, {TID: mine}))
        mine = parts(a) if a.assignment is not None else mine
        b = await c.heartbeat(req("b", b.epoch, {}))
    assert len(mine) == 3 and c.groups["g"].state.state_name() == "Stable"
    dup = await c.heartbeat(req("a2", 0, instance_id="i"))
    assert dup.error is ErrorCode.UNRELEASED_INSTANCE_ID
    gone = await c.heartbeat(req("a1", -2, instance_id="i"))
    assert gone.error is ErrorCode.NONE and gone.epoch == -2
    back = await c.heartbeat(req("a2", 0, instance_id="i"))
    assert back.error is ErrorCode.NONE and back.member_id == "a2"
    assert parts(back) == mine  # the same partitions, no rebalance of the others
    assert set(c.groups["g"].state.members) == {"a2", "b"}


async def test_session_timeout_removes_a_silent_member(env: Env) -> None:
    c = cg(make(env, session_timeout_ms=100))
    a = await c.heartbeat(req("a", 0))
    await c.heartbeat(req("b", 0))
    for _ in range(200):
        if "b" not in c.groups["g"].state.members:
            break
        await asyncio.sleep(0.01)
        a = await c.heartbeat(req("a", a.epoch, {TID: parts(a)} if a.assignment else None))
    assert set(c.groups["g"].state.members) == {"a"}


async def test_member_that_does_not_revoke_is_removed(env: Env) -> None:
    c = cg(make(env, session_timeout_ms=60_000))
    a = await c.heartbeat(req("a", 0, rebalance_timeout_ms=50))
    b = await c.heartbeat(req("b", 0))
    a2 = await c.heartbeat(req("a", a.epoch, {TID: parts(a)}))  # asked to revoke 3
    assert len(parts(a2)) == 3
    for _ in range(200):
        if "a" not in c.groups["g"].state.members:
            break
        await asyncio.sleep(0.01)
    assert set(c.groups["g"].state.members) == {"b"}
    b2 = await c.heartbeat(req("b", b.epoch, {}))
    assert parts(b2) == frozenset(range(6))


async def test_conversions_between_classic_and_consumer(env: Env) -> None:
    coord = make(env)
    classic = await full_join(coord)
    assert classic.error is ErrorCode.NONE
    refused = await cg(coord).heartbeat(req("x", 0))
    assert refused.error is ErrorCode.GROUP_ID_NOT_FOUND
    assert refused.message is not None and "classic group with 1 member" in refused.message
    top, _ = await coord.leave_group("g", [(classic.member_id, None)])
    assert top is ErrorCode.NONE
    joined = await cg(coord).heartbeat(req("x", 0))
    assert joined.error is ErrorCode.NONE  # the empty classic group became a consumer group
    assert await env.store.load_classic_revision("g") == 0
    assert [(g.group_id, g.group_type) for g in await coord.list_groups()] == [("g", "consumer")]
    why = await cg(coord).downgrade_error("g")
    assert why is not None and "consumer group" in why
    assert (await coord.delete_groups(["g"]))["g"] is ErrorCode.NON_EMPTY_GROUP
    left = await cg(coord).heartbeat(req("x", -1))
    assert left.error is ErrorCode.NONE
    assert await cg(coord).downgrade_error("g") is None  # empty: converted back
    again = await full_join(coord)
    assert again.error is ErrorCode.NONE
    assert [(g.group_id, g.group_type) for g in await coord.list_groups()] == [("g", "classic")]


async def test_delete_empty_consumer_group(env: Env) -> None:
    coord = make(env)
    await cg(coord).heartbeat(req("x", 0))
    await cg(coord).heartbeat(req("x", -1))
    assert (await coord.delete_groups(["g"]))["g"] is ErrorCode.NONE
    assert await env.store.load_consumer_group("g") is None
    assert (await coord.delete_groups(["g"]))["g"] is ErrorCode.GROUP_ID_NOT_FOUND


async def test_offset_delete_refuses_subscribed_topics(env: Env) -> None:
    from groupcoord import TopicPartition

    coord = make(env)
    await cg(coord).heartbeat(req("x", 0))
    tp = TopicPartition("t", 0)
    other = TopicPartition("u", 0)
    result = await coord.delete_offsets("g", [tp, other])
    assert result.partitions == {
        tp: ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC,
        other: ErrorCode.NONE,
    }


async def test_offsets_of_an_empty_consumer_group_expire(env: Env) -> None:
    from groupcoord import OffsetCommit, TopicPartition

    coord = make(env)
    joined = await cg(coord).heartbeat(req("x", 0))
    tp = TopicPartition("t", 0)
    errors = await coord.commit_offsets("g", joined.epoch, "x", None, [OffsetCommit(tp, 5)])
    assert errors == {tp: ErrorCode.NONE}
    retention = FAST.offsets_retention_minutes * 60_000
    env.clock.now += 2 * retention
    assert await coord.expire_offsets() == 0  # a member: nothing expires
    await cg(coord).heartbeat(req("x", -1))  # empty from now on
    env.clock.now += retention // 2
    assert await coord.expire_offsets() == 0
    env.clock.now += retention
    assert await coord.expire_offsets() == 1
    assert await env.store.load_consumer_group("g") is None
    assert await env.store.fetch_offsets("g") == {}
