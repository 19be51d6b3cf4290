"""Offset commits/fetches, describe/list/delete, and retention, over the embedded store."""

from __future__ import annotations

import asyncio
import struct

from groupcoord import GroupConfig, GroupCoordinator, OffsetCommit, TopicPartition
from groupcoord.model import MAX_OFFSET_METADATA_CHARS
from protocol.errors import ErrorCode
from tests.unit.groupcoord.conftest import Env, full_join, join_req
from tests.unit.groupcoord.test_membership import form_stable

E = ErrorCode
T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


def subscription(*topics: str) -> bytes:
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


async def test_member_commits_are_generation_checked(coord: GroupCoordinator) -> None:
    ids = await form_stable(coord, 1)
    ok = await coord.commit_offsets("g", 1, ids[0], None, [OffsetCommit(T0, 5, 3, "meta")])
    assert ok == {T0: E.NONE}
    assert await coord.commit_offsets("g", 2, ids[0], None, [OffsetCommit(T0, 6)]) == {
        T0: E.ILLEGAL_GENERATION
    }
    assert await coord.commit_offsets("g", 1, "ghost", None, [OffsetCommit(T0, 6)]) == {
        T0: E.UNKNOWN_MEMBER_ID
    }
    assert await coord.commit_offsets("g", -1, "", None, [OffsetCommit(T0, 6)]) == {
        T0: E.UNKNOWN_MEMBER_ID
    }
    err, offsets = await coord.fetch_offsets("g", [T0, T1])
    assert err is E.NONE and set(offsets) == {T0}
    assert (offsets[T0].offset, offsets[T0].leader_epoch, offsets[T0].metadata) == (5, 3, "meta")


async def test_commit_during_completing_rebalance_is_refused(coord: GroupCoordinator) -> None:
    res = await full_join(coord)
    got = await coord.commit_offsets("g", 1, res.member_id, None, [OffsetCommit(T0, 1)])
    assert got == {T0: E.REBALANCE_IN_PROGRESS}


async def test_simple_commits_and_metadata_limit(coord: GroupCoordinator) -> None:
    long_meta = "x" * (MAX_OFFSET_METADATA_CHARS + 1)
    got = await coord.commit_offsets(
        "solo", -1, "", None, [OffsetCommit(T0, 10), OffsetCommit(T1, 11, metadata=long_meta)]
    )
    assert got == {T0: E.NONE, T1: E.OFFSET_METADATA_TOO_LARGE}
    assert await coord.commit_offsets("nogroup", 3, "m", None, [OffsetCommit(T0, 1)]) == {
        T0: E.ILLEGAL_GENERATION
    }
    _, offsets = await coord.fetch_offsets("solo")
    assert {tp: r.offset for tp, r in offsets.items()} == {T0: 10}
    listed = await coord.list_groups()
    assert [(g.group_id, g.state, g.protocol_type) for g in listed] == [("solo", "Empty", "")]
    assert (await coord.describe_group("solo")).state == "Empty"
    assert (await coord.describe_group("missing")).state == "Dead"


async def test_list_groups_state_filter(coord: GroupCoordinator) -> None:
    await form_stable(coord, 1, group="stable")
    await coord.commit_offsets("empty", -1, "", None, [OffsetCommit(T0, 1)])
    all_ids = [g.group_id for g in await coord.list_groups()]
    assert all_ids == ["empty", "stable"]
    assert [g.group_id for g in await coord.list_groups(["STABLE"])] == ["stable"]
    assert [g.group_id for g in await coord.list_groups(["empty", "dead"])] == ["empty"]
    only_mine = GroupCoordinator(coord.store, coord.config, owns_group=lambda g: g == "empty")
    assert [g.group_id for g in await only_mine.list_groups()] == ["empty"]


async def test_describe_stable_group(coord: GroupCoordinator) -> None:
    ids = await form_stable(coord, 2)
    desc = await coord.describe_group("g")
    assert (desc.state, desc.protocol_type, desc.protocol_name) == ("Stable", "consumer", "range")
    assert [m.member_id for m in desc.members] == ids
    assert desc.members[0].client_host == "/127.0.0.1" and desc.members[0].metadata == b"m"


async def test_delete_groups(coord: GroupCoordinator, env: Env) -> None:
    ids = await form_stable(coord, 1)
    await coord.commit_offsets("g", 1, ids[0], None, [OffsetCommit(T0, 4)])
    await coord.commit_offsets("solo", -1, "", None, [OffsetCommit(T0, 4)])
    got = await coord.delete_groups(["g", "solo", "missing"])
    assert got == {"g": E.NON_EMPTY_GROUP, "solo": E.NONE, "missing": E.GROUP_ID_NOT_FOUND}
    await coord.leave_group("g", [(ids[0], None)])
    await asyncio.sleep(0.05)  # the Empty state is persisted in the background
    assert await coord.delete_groups(["g"]) == {"g": E.NONE}
    assert await env.store.list_groups() == []
    assert await coord.delete_groups(["g"]) == {"g": E.GROUP_ID_NOT_FOUND}
    # a deleted group can be used again from scratch
    again = await full_join(coord)
    assert again.error is E.NONE and again.generation == 1


async def test_offset_delete_refuses_subscribed_topics(coord: GroupCoordinator) -> None:
    other = TopicPartition("other", 0)
    res = await full_join(coord, protocols=(("range", subscription("t")),))
    await coord.sync_group("g", 1, res.member_id, None, {})
    await coord.commit_offsets(
        "g", 1, res.member_id, None, [OffsetCommit(T0, 1), OffsetCommit(other, 2)]
    )
    out = await coord.delete_offsets("g", [T0, other])
    assert out.error is E.NONE
    assert out.partitions == {T0: E.GROUP_SUBSCRIBED_TO_TOPIC, other: E.NONE}
    _, offsets = await coord.fetch_offsets("g")
    assert set(offsets) == {T0}
    assert (await coord.delete_offsets("missing", [T0])).error is E.GROUP_ID_NOT_FOUND


async def test_offsets_of_empty_groups_expire_after_retention(env: Env) -> None:
    coord = env.make(GroupConfig(min_session_timeout_ms=1, offsets_retention_minutes=1))
    ids = await form_stable(coord, 1)
    await coord.commit_offsets("g", 1, ids[0], None, [OffsetCommit(T0, 9)])
    await coord.commit_offsets("solo", -1, "", None, [OffsetCommit(T0, 1)])
    env.clock.now += 30_000
    await coord.commit_offsets("solo", -1, "", None, [OffsetCommit(T1, 2)])
    env.clock.now += 40_000  # 70 s after the first commits
    # an active group keeps its offsets however old; "solo" loses only the old one
    assert await coord.expire_offsets() == 1
    assert set((await coord.fetch_offsets("solo"))[1]) == {T1}
    assert set((await coord.fetch_offsets("g"))[1]) == {T0}
    await coord.leave_group("g", [(ids[0], None)])
    await asyncio.sleep(0.05)
    env.clock.now += 59_000
    # "solo" loses its last offset (and goes); "g" has been empty for less than the retention
    assert await coord.expire_offsets() == 1
    assert await env.store.list_groups() == ["g"]
    env.clock.now += 2_000
    assert await coord.expire_offsets() == 1
    assert await env.store.list_groups() == []
    assert "g" not in coord.groups


async def test_join_after_ownership_unload_reloads_state(coord: GroupCoordinator) -> None:
    ids = await form_stable(coord, 1)
    coord.unload("g")
    assert await coord.heartbeat("g", 1, ids[0], None) is E.NONE
    rejoin = await coord.join_group(join_req(member_id=ids[0]))
    assert rejoin.error is E.NONE and rejoin.generation == 2


async def test_drop_unowned_unloads_moved_groups_and_answers_waiters(env: Env) -> None:
    owned = {"g", "other"}
    coord = env.make()
    coord.owns_group = lambda g: g in owned
    await form_stable(coord, 1, group="other")
    a = await coord.join_group(join_req())
    b = await coord.join_group(join_req())
    ja, jb = await asyncio.gather(
        coord.join_group(join_req(member_id=a.member_id)),
        coord.join_group(join_req(member_id=b.member_id)),
    )
    follower = ja if not ja.members else jb
    sync = asyncio.ensure_future(coord.sync_group("g", 1, follower.member_id, None, {}))
    await asyncio.sleep(0.01)
    assert not sync.done()  # waiting for the leader
    owned.discard("g")
    coord.drop_unowned()
    assert set(coord.groups) == {"other"}
    assert (await sync).error is E.NOT_COORDINATOR
