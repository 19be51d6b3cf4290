"""KIP-848 consumer groups (``group.protocol=consumer``) with confluent-kafka over TCP.

One broker per backend for the module (local store + embedded metadata; SeaweedFS S3 +
etcd), with a short heartbeat interval so members converge quickly. Covers: members
sharing a topic with every record consumed once, a member joining and leaving under
load while the others keep their partitions and keep consuming, committed offsets
resuming a restarted member, the group surviving a broker restart, and the Kafka errors
of bad heartbeats and member-epoch checks on OffsetCommit.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kafka.protocol.consumer import (
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)

from protocol.errors import ErrorCode
from tests.fixtures.broker import BrokerProcess, start_broker
from tests.integration.conftest import BACKENDS, backend_kwargs, create_topic, unique_topic
from tests.integration.kafka_raw import RawConn
from tests.integration.kip848_members import Member, describe, heartbeat, wait_for

pytestmark = pytest.mark.integration

KIP848_ARGS = (
    "--group-consumer-heartbeat-interval-ms",
    "300",
    "--group-consumer-session-timeout-ms",
    "15000",
)


@pytest.fixture(scope="module", params=BACKENDS)
def broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    kwargs = backend_kwargs(request, request.param)
    extra = tuple(kwargs.pop("extra_args", ())) + KIP848_ARGS
    b = start_broker(tmp_path_factory.mktemp(f"kip848-{request.param}"), extra_args=extra, **kwargs)
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def local_only(broker: BrokerProcess) -> BrokerProcess:
    if "s3://" in " ".join(broker.args):
        pytest.skip("runs on the local backend only (the store plays no part in it)")
    return broker


def produce(bootstrap: str, topic: str, start: int, count: int, partitions: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(start, start + count):
        p.produce(topic, str(i).encode(), partition=i % partitions)
        p.poll(0)
    assert p.flush(30) == 0


def values(members: list[Member]) -> list[int]:
    out: list[int] = []
    for m in members:
        with m.lock:
            out.extend(int(v) for _, _, v in m.records)
    return out


def disjoint_cover(members: list[Member], partitions: int) -> bool:
    sets = [m.assignment() for m in members]
    union = frozenset().union(*sets)
    return union == frozenset(range(partitions)) and sum(len(s) for s in sets) == partitions


def test_three_members_share_a_topic_and_consume_each_record_once(broker: BrokerProcess) -> None:
    topic, group = unique_topic("kip848-share"), f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, 12)
    members = [Member(broker.bootstrap, group, [topic]).start() for _ in range(3)]
    try:
        wait_for(
            lambda: disjoint_cover(members, 12) and all(len(m.assignment()) == 4 for m in members),
            "three members with 4 partitions each",
        )
        produce(broker.bootstrap, topic, 0, 1200, 12)
        wait_for(lambda: len(values(members)) >= 1200, "1200 records consumed")
        got = values(members)
        assert sorted(got) == list(range(1200))  # every record once, none twice
        for m in members:
            with m.lock:
                assert {p for p, _, _ in m.records} <= m.assignment()
            assert m.errors == []
        d = describe(broker.port, group)
        assert d.error_code == 0 and d.group_state == "Stable" and len(d.members) == 3
        assert d.assignor_name == "uniform"
        assert all(m.member_type == 1 and m.member_epoch == d.group_epoch for m in d.members)
    finally:
        for m in members:
            m.close()


def test_member_joins_and_leaves_under_load(local_only: BrokerProcess) -> None:
    broker = local_only
    topic, group = unique_topic("kip848-churn"), f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, 12)
    a, b = (Member(broker.bootstrap, group, [topic]).start() for _ in range(2))
    stop = threading.Event()
    produced = [0]

    def load() -> None:
        while not stop.is_set():
            produce(broker.bootstrap, topic, produced[0], 50, 12)
            produced[0] += 50

    loader = threading.Thread(target=load, daemon=True)
    try:
        wait_for(lambda: disjoint_cover([a, b], 12), "two members covering the topic")
        loader.start()
        wait_for(lambda: a.count() > 0 and b.count() > 0, "both members consuming")
        c = Member(broker.bootstrap, group, [topic]).start()
        wait_for(
            lambda: disjoint_cover([a, b, c], 12) and len(c.assignment()) == 4,
            "the third member sharing the partitions",
        )
        before = (a.count(), b.count())
        wait_for(lambda: c.count() > 0, "the third member consuming")
        c.close()
        wait_for(lambda: disjoint_cover([a, b], 12), "the two members covering it again")
        wait_for(lambda: a.count() > before[0] and b.count() > before[1], "both still consuming")
        stop.set()
        loader.join(60)
        total = produced[0]
        wait_for(lambda: set(values([a, b, c])) >= set(range(total)), "every record consumed")
        # incremental: the first two never lost all their partitions while the third
        # came and went (no stop-the-world revocation)
        for m in (a, b):
            first = next(i for i, s in enumerate(m.assignments) if s)
            assert all(m.assignments[first:]), m.assignments
            assert m.errors == []
    finally:
        stop.set()
        for m in (a, b):
            m.close()


def test_committed_offsets_resume_a_restarted_member(broker: BrokerProcess) -> None:
    topic, group = unique_topic("kip848-resume"), f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, 3)
    produce(broker.bootstrap, topic, 0, 90, 3)
    first = Member(broker.bootstrap, group, [topic], commit_each=True).start()
    wait_for(lambda: first.count() >= 90, "90 records")
    first.close()
    produce(broker.bootstrap, topic, 90, 60, 3)
    again = Member(broker.bootstrap, group, [topic]).start()
    try:
        wait_for(lambda: again.count() >= 60, "the 60 new records")
        assert sorted(values([again])) == list(range(90, 150))
    finally:
        again.close()


def test_group_survives_a_broker_restart(broker: BrokerProcess) -> None:
    topic, group = unique_topic("kip848-restart"), f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, 4)
    m = Member(broker.bootstrap, group, [topic], commit_each=True).start()
    try:
        wait_for(lambda: len(m.assignment()) == 4, "the member owning every partition")
        before = describe(broker.port, group)
        broker.restart()
        after = describe(broker.port, group)
        assert after.error_code == 0
        assert [x.member_id for x in after.members] == [x.member_id for x in before.members]
        assert after.group_epoch == before.group_epoch
        produce(broker.bootstrap, topic, 0, 40, 4)
        wait_for(lambda: m.count() >= 40, "records after the restart")
        assert sorted(values([m])) == list(range(40))
        assert m.assignment() == frozenset(range(4))
    finally:
        m.close()


def _commit(port: int, group: str, topic: str, member: str, epoch: int) -> int:
    T = OffsetCommitRequest.OffsetCommitRequestTopic
    P = T.OffsetCommitRequestPartition
    req = OffsetCommitRequest(
        group_id=group,
        generation_id_or_member_epoch=epoch,
        member_id=member,
        group_instance_id=None,
        topics=[
            T(
                name=topic,
                partitions=[
                    P(
                        partition_index=0,
                        committed_offset=1,
                        committed_leader_epoch=-1,
                        committed_metadata="",
                    )
                ],
            )
        ],
    )
    with RawConn(port) as conn:
        resp = conn.call(req, OffsetCommitResponse, 9)
    return int(resp.topics[0].partitions[0].error_code)


def _fetch(port: int, group: str, topic: str, member: str | None, epoch: int) -> tuple[int, int]:
    """OffsetFetch v9: (group error, committed offset of partition 0)."""
    G = OffsetFetchRequest.OffsetFetchRequestGroup
    req = OffsetFetchRequest(
        groups=[
            G(
                group_id=group,
                member_id=member,
                member_epoch=epoch,
                topics=[G.OffsetFetchRequestTopics(name=topic, partition_indexes=[0])],
            )
        ],
        require_stable=False,
    )
    with RawConn(port) as conn:
        g = conn.call(req, OffsetFetchResponse, 9).groups[0]
    offset = g.topics[0].partitions[0].committed_offset if g.topics else -1
    return int(g.error_code), int(offset)


def test_bad_heartbeats_and_member_epochs(local_only: BrokerProcess) -> None:
    port = local_only.port
    topic, group = unique_topic("kip848-bad"), f"g-{uuid.uuid4().hex[:8]}"
    create_topic(local_only.bootstrap, topic, 2)
    joined = heartbeat(port, group_id=group, subscribed_topic_names=[topic])
    assert joined.error_code == 0 and joined.member_epoch >= 1 and joined.member_id
    mid, epoch = joined.member_id, joined.member_epoch
    assert joined.heartbeat_interval_ms == 300
    assert sorted(joined.assignment.topic_partitions[0].partitions) == [0, 1]

    def err(**fields: Any) -> Any:
        return heartbeat(port, group_id=group, **fields)

    fenced = err(member_id=mid, member_epoch=epoch + 5, topic_partitions=None)
    assert fenced.error_code == ErrorCode.FENCED_MEMBER_EPOCH
    assert "epoch" in fenced.error_message
    assert err(member_id="nobody", member_epoch=3).error_code == ErrorCode.UNKNOWN_MEMBER_ID
    bad_regex = err(subscribed_topic_regex="(unclosed")
    assert bad_regex.error_code == ErrorCode.INVALID_REGULAR_EXPRESSION
    assert err(subscribed_topic_regex="(?=x)y").error_code == ErrorCode.INVALID_REGULAR_EXPRESSION
    huge = err(subscribed_topic_names=[f"t{i}" for i in range(10_001)])
    assert huge.error_code == ErrorCode.INVALID_REQUEST
    assert "too large" in huge.error_message
    nosub = err(subscribed_topic_names=[])
    assert nosub.error_code == ErrorCode.INVALID_REQUEST
    assigner = err(subscribed_topic_names=[topic], server_assignor="sticky")
    assert assigner.error_code == ErrorCode.UNSUPPORTED_ASSIGNOR
    assert err(member_id=mid, member_epoch=-3).error_code == ErrorCode.INVALID_REQUEST
    # the member is still there, at its epoch
    ok = err(member_id=mid, member_epoch=epoch, topic_partitions=None)
    assert ok.error_code == 0 and ok.member_epoch == epoch
    # OffsetCommit v9 checks the member epoch of a consumer group
    assert _commit(port, group, topic, mid, epoch) == 0
    assert _commit(port, group, topic, mid, epoch - 1) == ErrorCode.STALE_MEMBER_EPOCH
    assert _commit(port, group, topic, "nobody", epoch) == ErrorCode.UNKNOWN_MEMBER_ID
    assert _commit(port, group, topic, "", -1) == ErrorCode.UNKNOWN_MEMBER_ID  # not empty
    # OffsetFetch v9 too, at the group level
    assert _fetch(port, group, topic, mid, epoch) == (0, 1)
    assert _fetch(port, group, topic, mid, epoch + 1)[0] == ErrorCode.STALE_MEMBER_EPOCH
    assert _fetch(port, group, topic, "nobody", epoch)[0] == ErrorCode.UNKNOWN_MEMBER_ID
    assert _fetch(port, group, topic, None, -1) == (0, 1)  # admin read: no member
    left = err(member_id=mid, member_epoch=-1)
    assert left.error_code == 0 and left.member_epoch == -1
    assert _commit(port, group, topic, "", -1) == 0  # empty now: admin commits allowed
    assert describe(port, group).group_state == "Empty"


def test_regex_subscription_picks_up_new_topics(local_only: BrokerProcess) -> None:
    prefix = f"kip848re{uuid.uuid4().hex[:6]}"
    create_topic(local_only.bootstrap, f"{prefix}-a", 2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    m = Member(local_only.bootstrap, group, [f"^{prefix}-.*"]).start()
    try:
        wait_for(lambda: len(m.assignment()) == 2, "the regex member on the first topic")
        create_topic(local_only.bootstrap, f"{prefix}-b", 3)
        produce(local_only.bootstrap, f"{prefix}-b", 0, 30, 3)
        wait_for(lambda: m.count() >= 30, "records of the topic created later")
        d = describe(local_only.port, group)
        assert prefix in (d.members[0].subscribed_topic_regex or "")
        names = {t.topic_name for t in d.members[0].assignment.topic_partitions}
        assert names == {f"{prefix}-a", f"{prefix}-b"}
    finally:
        m.close()


def test_static_member_comes_back_to_its_partitions(local_only: BrokerProcess) -> None:
    broker = local_only
    topic, group = unique_topic("kip848-static"), f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, 4)
    static = {"group.instance.id": "instance-1"}
    a = Member(broker.bootstrap, group, [topic], static).start()
    b = Member(broker.bootstrap, group, [topic]).start()
    try:
        wait_for(lambda: disjoint_cover([a, b], 4) and len(a.assignment()) == 2, "two members")
        mine, settled = a.assignment(), len(b.assignments)
        a.close()  # a static member leaving keeps its partitions (epoch -2)
        wait_for(
            lambda: any(m.member_epoch == -2 for m in describe(broker.port, group).members),
            "the static member marked as gone for now",
        )
        again = Member(broker.bootstrap, group, [topic], static).start()
        try:
            wait_for(lambda: again.assignment() == mine, "the same partitions back")
            d = describe(broker.port, group)
            assert len(d.members) == 2 and {m.instance_id for m in d.members} == {
                "instance-1",
                None,
            }
            assert len(b.assignments) == settled  # the other member was not disturbed
        finally:
            again.close()
    finally:
        b.close()
