"""The classic group state machine, over the real embedded metadata store."""

from __future__ import annotations

import asyncio

from groupcoord import GroupConfig, GroupCoordinator, GroupState
from protocol.errors import ErrorCode
from tests.unit.groupcoord.conftest import FAST, Env, full_join, join_req, spawn

E = ErrorCode


def state(coord: GroupCoordinator, group: str = "g") -> GroupState:
    return coord.groups[group].state


async def form_stable(coord: GroupCoordinator, n: int, group: str = "g") -> list[str]:
    """n members join at once; the leader assigns b"a-<id>"; returns member ids (leader first)."""
    firsts = [await coord.join_group(join_req(group)) for _ in range(n)]
    assert all(f.error is E.MEMBER_ID_REQUIRED for f in firsts)
    joins = await asyncio.gather(
        *(coord.join_group(join_req(group, member_id=f.member_id)) for f in firsts)
    )
    assert {j.error for j in joins} == {E.NONE}
    assert len({j.generation for j in joins}) == 1
    leader = joins[0].leader
    ids = [leader] + [j.member_id for j in joins if j.member_id != leader]
    gen = joins[0].generation
    syncs = [
        spawn(coord.sync_group(group, gen, m, None, {}))
        for m in ids[1:]  # followers first: they wait for the leader
    ]
    await asyncio.sleep(0)
    lead = await coord.sync_group(group, gen, leader, None, {m: f"a-{m}".encode() for m in ids})
    assert lead.error is E.NONE and lead.assignment == f"a-{leader}".encode()
    for m, t in zip(ids[1:], syncs, strict=True):
        r = await t
        assert r.error is E.NONE and r.assignment == f"a-{m}".encode()
    assert state(coord, group) is GroupState.STABLE
    return ids


async def test_member_id_required_then_join_elects_leader_and_stabilises(
    coord: GroupCoordinator, env: Env
) -> None:
    first = await coord.join_group(join_req())
    assert first.error is E.MEMBER_ID_REQUIRED and first.member_id.startswith("c-")
    joined = await coord.join_group(join_req(member_id=first.member_id))
    assert joined.error is E.NONE
    assert joined.generation == 1 and joined.leader == first.member_id
    assert [m.member_id for m in joined.members] == [first.member_id]
    assert joined.members[0].metadata == b"m" and joined.protocol_name == "range"
    assert state(coord) is GroupState.COMPLETING_REBALANCE
    synced = await coord.sync_group("g", 1, first.member_id, None, {first.member_id: b"A"})
    assert synced.error is E.NONE and synced.assignment == b"A"
    stored = await env.store.load_group("g")
    assert stored is not None and stored.record.generation == 1
    assert stored.record.members[0].assignment == b"A"


async def test_followers_get_no_member_list_and_wait_for_leader_sync(
    coord: GroupCoordinator,
) -> None:
    ids = await form_stable(coord, 3)
    assert len(set(ids)) == 3
    assert await coord.heartbeat("g", 1, ids[1], None) is E.NONE


async def test_v3_join_without_member_id_required(coord: GroupCoordinator) -> None:
    req = join_req()
    old = type(req)(
        **{**{f: getattr(req, f) for f in req.__slots__}, "require_known_member_id": False}
    )
    res = await coord.join_group(old)
    assert res.error is E.NONE and res.member_id and res.generation == 1


async def test_heartbeat_errors(coord: GroupCoordinator) -> None:
    assert await coord.heartbeat("nope", 1, "x", None) is E.UNKNOWN_MEMBER_ID
    ids = await form_stable(coord, 1)
    assert await coord.heartbeat("g", 1, "stranger", None) is E.UNKNOWN_MEMBER_ID
    assert await coord.heartbeat("g", 7, ids[0], None) is E.ILLEGAL_GENERATION
    assert await coord.heartbeat("g", 1, ids[0], None) is E.NONE
    # a second member's join puts the group in PreparingRebalance
    newcomer = spawn(full_join(coord))
    await asyncio.sleep(0.01)
    assert state(coord) is GroupState.PREPARING_REBALANCE
    assert await coord.heartbeat("g", 1, ids[0], None) is E.REBALANCE_IN_PROGRESS
    assert (await coord.sync_group("g", 1, ids[0], None, {})).error is E.REBALANCE_IN_PROGRESS
    rejoin = await coord.join_group(join_req(member_id=ids[0]))
    joined = await newcomer
    assert rejoin.error is E.NONE and joined.error is E.NONE
    assert rejoin.generation == joined.generation == 2
    assert rejoin.leader == ids[0] and len(rejoin.members) == 2 and joined.members == ()


async def test_sync_errors(coord: GroupCoordinator) -> None:
    assert (await coord.sync_group("nope", 1, "x", None, {})).error is E.UNKNOWN_MEMBER_ID
    ids = await form_stable(coord, 1)
    assert (await coord.sync_group("g", 2, ids[0], None, {})).error is E.ILLEGAL_GENERATION
    bad = await coord.sync_group("g", 1, ids[0], None, {}, "consumer", "roundrobin")
    assert bad.error is E.INCONSISTENT_GROUP_PROTOCOL
    again = await coord.sync_group("g", 1, ids[0], None, {})
    assert again.error is E.NONE and again.assignment == f"a-{ids[0]}".encode()


async def test_join_validation(coord: GroupCoordinator, env: Env) -> None:
    assert (await coord.join_group(join_req(group=""))).error is E.INVALID_GROUP_ID
    assert (await coord.join_group(join_req(session_ms=10**8))).error is E.INVALID_SESSION_TIMEOUT
    big = (("range", b"x" * (FAST.max_member_metadata_bytes + 1)),)
    assert (await coord.join_group(join_req(protocols=big))).error is E.INVALID_REQUEST
    assert (await coord.join_group(join_req(member_id="ghost"))).error is E.UNKNOWN_MEMBER_ID
    await form_stable(coord, 1)
    other_type = await coord.join_group(join_req(protocol_type="connect"))
    assert other_type.error is E.INCONSISTENT_GROUP_PROTOCOL
    disjoint = await coord.join_group(join_req(protocols=(("sticky", b""),)))
    assert disjoint.error is E.INCONSISTENT_GROUP_PROTOCOL


async def test_protocol_selected_by_common_support_and_votes(coord: GroupCoordinator) -> None:
    a = await coord.join_group(join_req(protocols=(("range", b"r"), ("roundrobin", b"rr"))))
    b = await coord.join_group(join_req(protocols=(("roundrobin", b"rr2"), ("sticky", b"s"))))
    ja, jb = await asyncio.gather(
        coord.join_group(
            join_req(member_id=a.member_id, protocols=(("range", b"r"), ("roundrobin", b"rr")))
        ),
        coord.join_group(
            join_req(member_id=b.member_id, protocols=(("roundrobin", b"rr2"), ("sticky", b"s")))
        ),
    )
    assert ja.protocol_name == jb.protocol_name == "roundrobin"
    leader = ja if ja.members else jb
    assert {m.metadata for m in leader.members} == {b"rr", b"rr2"}


async def test_member_that_never_rejoins_is_dropped_at_rebalance_timeout(
    coord: GroupCoordinator,
) -> None:
    ids = await form_stable(coord, 2)
    # ids[1] rejoins with new metadata (triggers a rebalance); ids[0] never does
    res = await asyncio.wait_for(
        coord.join_group(
            join_req(member_id=ids[1], protocols=(("range", b"new"),), rebalance_ms=200)
        ),
        5,
    )
    assert res.error is E.NONE and res.generation == 2
    assert res.leader == ids[1] and [m.member_id for m in res.members] == [ids[1]]
    assert await coord.heartbeat("g", 2, ids[0], None) is E.UNKNOWN_MEMBER_ID


async def test_session_expiry_removes_member_and_last_one_leaves_group_empty(
    coord: GroupCoordinator, env: Env
) -> None:
    res = await full_join(coord, session_ms=150)
    assert (
        await coord.sync_group("g", 1, res.member_id, None, {res.member_id: b"x"})
    ).error is E.NONE
    for _ in range(3):  # heartbeats keep it alive past one session timeout
        await asyncio.sleep(0.07)
        assert await coord.heartbeat("g", 1, res.member_id, None) is E.NONE
    assert state(coord) is GroupState.STABLE
    await asyncio.sleep(0.4)
    assert state(coord) is GroupState.EMPTY
    assert coord.groups["g"].generation == 2
    await asyncio.sleep(0.05)
    stored = await env.store.load_group("g")
    assert stored is not None and stored.record.members == () and stored.record.generation == 2


async def test_leader_that_never_syncs_is_removed_and_followers_rebalance(
    coord: GroupCoordinator,
) -> None:
    a = await coord.join_group(join_req(rebalance_ms=300))
    b = await coord.join_group(join_req(rebalance_ms=300))
    ja, jb = await asyncio.gather(
        coord.join_group(join_req(member_id=a.member_id, rebalance_ms=300)),
        coord.join_group(join_req(member_id=b.member_id, rebalance_ms=300)),
    )
    leader, follower = (ja, jb) if ja.members else (jb, ja)
    # the follower syncs, the leader only heartbeats: the sync timeout removes the leader
    fsync = spawn(coord.sync_group("g", 1, follower.member_id, None, {}))
    assert await coord.heartbeat("g", 1, leader.member_id, None) is E.NONE
    r = await asyncio.wait_for(fsync, 5)
    assert r.error is E.REBALANCE_IN_PROGRESS
    rejoin = await asyncio.wait_for(
        coord.join_group(join_req(member_id=follower.member_id, rebalance_ms=300)), 5
    )
    assert rejoin.error is E.NONE and rejoin.leader == follower.member_id
    assert await coord.heartbeat("g", 1, leader.member_id, None) is E.UNKNOWN_MEMBER_ID


async def test_leave_group_batch_and_unknown_members(coord: GroupCoordinator, env: Env) -> None:
    ids = await form_stable(coord, 2)
    err, per = await coord.leave_group("g", [(ids[0], None), ("ghost", None), (ids[1], None)])
    assert err is E.NONE and per == [E.NONE, E.UNKNOWN_MEMBER_ID, E.NONE]
    assert state(coord) is GroupState.EMPTY and coord.groups["g"].generation == 2
    err, per = await coord.leave_group("none", [("x", None)])
    assert per == [E.UNKNOWN_MEMBER_ID]


async def test_leave_during_rebalance_completes_join_for_the_rest(coord: GroupCoordinator) -> None:
    ids = await form_stable(coord, 2)
    rejoin = spawn(coord.join_group(join_req(member_id=ids[1], protocols=(("range", b"v2"),))))
    await asyncio.sleep(0.01)
    assert state(coord) is GroupState.PREPARING_REBALANCE
    _, per = await coord.leave_group("g", [(ids[0], None)])
    assert per == [E.NONE]
    res = await asyncio.wait_for(rejoin, 2)
    assert res.error is E.NONE and res.generation == 2 and res.leader == ids[1]


async def test_static_member_rejoin_keeps_generation_and_fences_old_id(
    coord: GroupCoordinator,
) -> None:
    first = await coord.join_group(join_req(instance_id="i-1"))
    assert first.error is E.NONE  # static members skip MEMBER_ID_REQUIRED
    old = first.member_id
    assert (await coord.sync_group("g", 1, old, "i-1", {old: b"P"})).error is E.NONE
    again = await coord.join_group(join_req(instance_id="i-1"))
    assert again.error is E.NONE and again.generation == 1 and again.member_id != old
    assert again.leader == again.member_id and again.skip_assignment
    assert state(coord) is GroupState.STABLE
    assert await coord.heartbeat("g", 1, old, "i-1") is E.FENCED_INSTANCE_ID
    assert await coord.heartbeat("g", 1, again.member_id, "i-1") is E.NONE
    sync = await coord.sync_group("g", 1, again.member_id, "i-1", {})
    assert sync.assignment == b"P"
    _, per = await coord.leave_group("g", [(old, "i-1")])
    assert per == [E.FENCED_INSTANCE_ID]
    _, per = await coord.leave_group("g", [("", "i-1")])
    assert per == [E.NONE] and state(coord) is GroupState.EMPTY


async def test_static_member_with_changed_protocols_triggers_rebalance(
    coord: GroupCoordinator,
) -> None:
    first = await coord.join_group(join_req(instance_id="i-1"))
    await coord.sync_group("g", 1, first.member_id, "i-1", {})
    again = await coord.join_group(join_req(instance_id="i-1", protocols=(("range", b"other"),)))
    assert again.error is E.NONE and again.generation == 2


async def test_initial_rebalance_delay_collects_members(env: Env) -> None:
    coord = env.make(GroupConfig(min_session_timeout_ms=1, initial_rebalance_delay_ms=150))
    a = await coord.join_group(join_req())
    first = spawn(coord.join_group(join_req(member_id=a.member_id)))
    await asyncio.sleep(0.05)
    b = await full_join(coord)
    ra = await first
    assert ra.generation == b.generation == 1
    assert len((ra if ra.members else b).members) == 2


async def test_state_survives_a_new_coordinator(env: Env) -> None:
    c1 = env.make()
    ids = await form_stable(c1, 2)
    await c1.stop()
    c2 = env.make()
    assert await c2.heartbeat("g", 1, ids[1], None) is E.NONE
    assert state(c2) is GroupState.STABLE
    desc = await c2.describe_group("g")
    assert desc.state == "Stable" and {m.member_id for m in desc.members} == set(ids)
    assert {m.assignment for m in desc.members} == {f"a-{m}".encode() for m in ids}
    sync = await c2.sync_group("g", 1, ids[0], None, {})
    assert sync.assignment == f"a-{ids[0]}".encode()


async def test_conflicting_owner_write_fences_sync(env: Env) -> None:
    c1, c2 = env.make(), env.make()
    first = await full_join(c1)
    # another coordinator took the group over and wrote its state meanwhile
    await c2.get_group("g", create=True)
    await c2.persist(c2.groups["g"])
    res = await c1.sync_group("g", 1, first.member_id, None, {first.member_id: b"x"})
    assert res.error is E.NOT_COORDINATOR
    assert "g" not in c1.groups
