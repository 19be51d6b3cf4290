"""Group APIs at the wire level, every supported version family, and the error codes Kafka
returns for bad input (raw frames from kafka-python's protocol classes, real broker)."""

from __future__ import annotations

import struct
import uuid
from typing import Any

import pytest
from kafka.protocol.admin import (
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.consumer import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from protocol.errors import ErrorCode as E
from tests.fixtures.broker import BrokerProcess, shared_broker  # noqa: F401 - fixture
from tests.integration.group_member import create_topic
from tests.integration.kafka_raw import RawConn

pytestmark = pytest.mark.integration

_Proto = JoinGroupRequest.JoinGroupRequestProtocol
_Assign = SyncGroupRequest.SyncGroupRequestAssignment
_Leaver = LeaveGroupRequest.MemberIdentity
_CTopic = OffsetCommitRequest.OffsetCommitRequestTopic
_CPart = _CTopic.OffsetCommitRequestPartition
_FTopic = OffsetFetchRequest.OffsetFetchRequestTopic
_FGroup = OffsetFetchRequest.OffsetFetchRequestGroup
_FGroupTopic = _FGroup.OffsetFetchRequestTopics
_DTopic = OffsetDeleteRequest.OffsetDeleteRequestTopic
_DPart = _DTopic.OffsetDeleteRequestPartition


def subscription(*topics: str) -> bytes:
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


@pytest.fixture(scope="module")
def topic(shared_broker: BrokerProcess) -> str:  # noqa: F811
    name = f"wire-{uuid.uuid4().hex[:8]}"
    create_topic(shared_broker.bootstrap, name, 2)
    return name


def join(c: RawConn, v: int, group: str, member_id: str = "", **kw: Any) -> Any:
    req = JoinGroupRequest(
        group_id=group,
        session_timeout_ms=kw.get("session", 6000),
        rebalance_timeout_ms=6000,
        member_id=member_id,
        group_instance_id=kw.get("instance"),
        protocol_type="consumer",
        protocols=[_Proto(name="range", metadata=kw.get("meta", subscription("t")))],
        reason=None,
    )
    return c.call(req, JoinGroupResponse, v)


def commit(c: RawConn, v: int, group: str, gen: int, member: str, topic: str, off: int) -> Any:
    req = OffsetCommitRequest(
        group_id=group,
        generation_id_or_member_epoch=gen,
        member_id=member,
        group_instance_id=None,
        retention_time_ms=-1,
        topics=[
            _CTopic(
                name=topic,
                partitions=[
                    _CPart(
                        partition_index=p,
                        committed_offset=off,
                        committed_leader_epoch=-1,
                        commit_timestamp=-1,
                        committed_metadata="m",
                    )
                    for p in (0, 1, 7)
                ],
            )
        ],
    )
    return c.call(req, OffsetCommitResponse, v)


# (JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch) versions
PROFILES = [(0, 0, 0, 0, 0, 0), (1, 1, 1, 1, 2, 1), (3, 2, 2, 2, 4, 3), (4, 3, 3, 3, 6, 5)]
PROFILES += [(5, 3, 3, 3, 7, 6), (7, 4, 4, 4, 8, 7), (9, 5, 4, 5, 8, 8)]


@pytest.mark.parametrize("versions", PROFILES, ids=lambda p: f"join-v{p[0]}")
def test_member_lifecycle_per_version(
    shared_broker: BrokerProcess,  # noqa: F811
    topic: str,
    versions: tuple[int, ...],
) -> None:
    jv, sv, hv, lv, cv, fv = versions
    group = f"wire-{jv}-{uuid.uuid4().hex[:6]}"
    with RawConn(shared_broker.port) as c:
        res = join(c, jv, group)
        if jv >= 4:
            assert res.error_code == E.MEMBER_ID_REQUIRED and res.member_id
            res = join(c, jv, group, res.member_id)
        assert res.error_code == 0 and res.generation_id == 1 and res.leader == res.member_id
        assert res.protocol_name == "range" and len(res.members) == 1
        me, gen = res.member_id, res.generation_id
        sync = SyncGroupRequest(
            group_id=group,
            generation_id=gen,
            member_id=me,
            group_instance_id=None,
            protocol_type="consumer",
            protocol_name="range",
            assignments=[_Assign(member_id=me, assignment=b"ASSIGNED")],
        )
        synced = c.call(sync, SyncGroupResponse, sv)
        assert synced.error_code == 0 and synced.assignment == b"ASSIGNED"
        hb = HeartbeatRequest(
            group_id=group, generation_id=gen, member_id=me, group_instance_id=None
        )
        assert c.call(hb, HeartbeatResponse, hv).error_code == 0
        hb.generation_id = gen + 5
        assert c.call(hb, HeartbeatResponse, hv).error_code == E.ILLEGAL_GENERATION
        gen_for_commit = gen if cv >= 1 else -1
        if cv == 0:  # v0 has no generation: a standalone commit, refused while members exist
            errs = commit(c, cv, group, -1, "", topic, 5)
            assert {p.error_code for t in errs.topics for p in t.partitions} >= {
                E.UNKNOWN_MEMBER_ID
            }
        else:
            errs = commit(c, cv, group, gen_for_commit, me, topic, 5)
            by_p = {p.partition_index: p.error_code for t in errs.topics for p in t.partitions}
            assert by_p == {0: 0, 1: 0, 7: E.UNKNOWN_TOPIC_OR_PARTITION}
            fetched = c.call(
                OffsetFetchRequest(
                    group_id=group,
                    topics=[_FTopic(name=topic, partition_indexes=[0, 1])],
                    groups=[
                        _FGroup(
                            group_id=group,
                            topics=[_FGroupTopic(name=topic, partition_indexes=[0, 1])],
                        )
                    ],
                    require_stable=False,
                ),
                OffsetFetchResponse,
                fv,
            )
            topics = fetched.groups[0].topics if fv >= 8 else fetched.topics
            assert [
                (p.partition_index, p.committed_offset, p.metadata) for p in topics[0].partitions
            ] == [
                (0, 5, "m"),
                (1, 5, "m"),
            ]
        leave = LeaveGroupRequest(
            group_id=group, member_id=me, members=[_Leaver(member_id=me, group_instance_id=None)]
        )
        left = c.call(leave, LeaveGroupResponse, lv)
        assert left.error_code == 0
        if lv >= 3:
            assert [(m.member_id, m.error_code) for m in left.members] == [(me, 0)]
        assert c.call(hb, HeartbeatResponse, hv).error_code == E.UNKNOWN_MEMBER_ID


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_find_coordinator(shared_broker: BrokerProcess, version: int) -> None:  # noqa: F811
    with RawConn(shared_broker.port) as c:
        req = FindCoordinatorRequest(key="g1", key_type=0, coordinator_keys=["g1", "g2"])
        res = c.call(req, FindCoordinatorResponse, version)
        if version < 4:
            assert (res.error_code, res.host, res.port) == (0, "127.0.0.1", shared_broker.port)
        else:
            got = [(x.key, x.error_code, x.port) for x in res.coordinators]
            assert got == [("g1", 0, shared_broker.port), ("g2", 0, shared_broker.port)]
        if version >= 1:  # transactional ids: placed like groups (one broker: this one)
            req = FindCoordinatorRequest(key="tx", key_type=1, coordinator_keys=["tx"])
            res = c.call(req, FindCoordinatorResponse, version)
            if version >= 4:
                got = [(x.key, x.error_code, x.port) for x in res.coordinators]
                assert got == [("tx", 0, shared_broker.port)]
            else:
                assert (res.error_code, res.port) == (0, shared_broker.port)


def test_bad_join_input_gets_kafka_error_codes(shared_broker: BrokerProcess) -> None:  # noqa: F811
    group = f"bad-{uuid.uuid4().hex[:6]}"
    with RawConn(shared_broker.port) as c:
        assert join(c, 5, group, session=10).error_code == E.INVALID_SESSION_TIMEOUT
        assert join(c, 5, group, "nobody").error_code == E.UNKNOWN_MEMBER_ID
        huge = b"x" * (200 * 1024)
        assert join(c, 5, group, meta=huge).error_code == E.INVALID_REQUEST
        assert join(c, 5, "", instance="i").error_code == E.INVALID_GROUP_ID
        sync = SyncGroupRequest(group_id=group, generation_id=1, member_id="x", assignments=[])
        assert c.call(sync, SyncGroupResponse, 3).error_code == E.UNKNOWN_MEMBER_ID
        first = join(c, 5, group, instance="static-1")
        assert first.error_code == 0
        # an old incarnation of a static member is fenced
        second = join(c, 5, group, instance="static-1")
        hb = HeartbeatRequest(
            group_id=group, generation_id=1, member_id=first.member_id, group_instance_id="static-1"
        )
        assert second.member_id != first.member_id
        assert c.call(hb, HeartbeatResponse, 3).error_code == E.FENCED_INSTANCE_ID


def test_admin_apis_across_versions(shared_broker: BrokerProcess, topic: str) -> None:  # noqa: F811
    group = f"adm-{uuid.uuid4().hex[:6]}"
    with RawConn(shared_broker.port) as c:
        res = join(c, 5, group, instance="i1", meta=subscription(topic))
        sync = SyncGroupRequest(
            group_id=group, generation_id=1, member_id=res.member_id, assignments=[]
        )
        assert c.call(sync, SyncGroupResponse, 3).error_code == 0
        for v in (0, 5):
            d = c.call(DescribeGroupsRequest(groups=[group, "nope"]), DescribeGroupsResponse, v)
            g, missing = d.groups
            assert (g.group_state, g.protocol_type, g.protocol_data) == (
                "Stable",
                "consumer",
                "range",
            )
            assert g.members[0].client_id == "raw" and g.members[0].client_host == "/127.0.0.1"
            assert missing.group_state == "Dead" and missing.error_code == 0
        listed = c.call(ListGroupsRequest(), ListGroupsResponse, 0)
        assert group in [g.group_id for g in listed.groups]
        only_empty = c.call(ListGroupsRequest(states_filter=["Empty"]), ListGroupsResponse, 4)
        assert group not in [g.group_id for g in only_empty.groups]
        stable = c.call(ListGroupsRequest(states_filter=["stable"]), ListGroupsResponse, 4)
        assert [g.group_state for g in stable.groups if g.group_id == group] == ["Stable"]
        commit(c, 6, group, 1, res.member_id, topic, 3)
        od = OffsetDeleteRequest(
            group_id=group, topics=[_DTopic(name=topic, partitions=[_DPart(partition_index=0)])]
        )
        r = c.call(od, OffsetDeleteResponse, 0)
        assert r.topics[0].partitions[0].error_code == E.GROUP_SUBSCRIBED_TO_TOPIC
        dg = c.call(DeleteGroupsRequest(groups_names=[group, "nope"]), DeleteGroupsResponse, 2)
        assert [(x.group_id, x.error_code) for x in dg.results] == [
            (group, E.NON_EMPTY_GROUP),
            ("nope", E.GROUP_ID_NOT_FOUND),
        ]
        leave = LeaveGroupRequest(
            group_id=group, members=[_Leaver(member_id="", group_instance_id="i1")]
        )
        assert c.call(leave, LeaveGroupResponse, 4).members[0].error_code == 0
        r = c.call(od, OffsetDeleteResponse, 0)
        assert (r.error_code, r.topics[0].partitions[0].error_code) == (0, 0)
        dg = c.call(DeleteGroupsRequest(groups_names=[group]), DeleteGroupsResponse, 0)
        assert dg.results[0].error_code == 0
        all_of = c.call(
            OffsetFetchRequest(groups=[_FGroup(group_id=group, topics=None)]),
            OffsetFetchResponse,
            8,
        )
        assert all_of.groups[0].topics == []
