"""KIP-848 consumer groups next to classic ones, with real clients over TCP: a group
converting between the two kinds as its members change (offsets carried over, members
of the other kind refused while it has members), ``kafscale groups`` showing consumer
groups, and a consumer group moving to another coordinator (two brokers on one etcd).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol.errors import ErrorCode
from tests.fixtures.broker import BrokerProcess, start_broker
from tests.integration.conftest import create_topic, unique_topic
from tests.integration.kafka_raw import RawConn
from tests.integration.kip848_members import Member, describe, heartbeat, wait_for
from tests.integration.test_consumer_groups_kip848 import KIP848_ARGS, produce, values

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def local_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker on the local store (the store plays no part in these tests)."""
    b = start_broker(tmp_path_factory.mktemp("kip848-migration"), extra_args=KIP848_ARGS)
    try:
        yield b
    finally:
        b.stop()


def _classic_join(port: int, group: str) -> int:
    from kafka.protocol.consumer import JoinGroupRequest, JoinGroupResponse

    proto = JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"\x00\x00")
    req = JoinGroupRequest(
        group_id=group,
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        member_id="",
        group_instance_id=None,
        protocol_type="consumer",
        protocols=[proto],
    )
    with RawConn(port) as conn:
        return int(conn.call(req, JoinGroupResponse, 5).error_code)


def test_mixed_classic_and_consumer_members(local_only: BrokerProcess) -> None:
    """A group used by classic members converts to a consumer group once they are gone,
    and back; committed offsets carry over; members of the other kind are refused while
    the group has members."""
    from confluent_kafka import ConsumerGroupType
    from confluent_kafka.admin import AdminClient

    broker = local_only
    topic, group = unique_topic("kip848-mixed"), f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, 4)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})

    def kind() -> Any:
        (fut,) = admin.describe_consumer_groups([group], request_timeout=30).values()
        return fut.result(timeout=30)

    produce(broker.bootstrap, topic, 0, 40, 4)
    classic = Member(
        broker.bootstrap, group, [topic], {"group.protocol": "classic"}, commit_each=True
    ).start()
    wait_for(lambda: classic.count() >= 40, "the classic member reading 40")
    refused = heartbeat(broker.port, group_id=group, subscribed_topic_names=[topic])
    assert refused.error_code == ErrorCode.GROUP_ID_NOT_FOUND
    assert "classic group" in refused.error_message
    assert kind().type == ConsumerGroupType.CLASSIC
    classic.close()

    produce(broker.bootstrap, topic, 40, 20, 4)
    modern = Member(broker.bootstrap, group, [topic], commit_each=True).start()
    wait_for(lambda: modern.count() >= 20, "the consumer-protocol member reading 20")
    assert sorted(values([modern])) == list(range(40, 60))  # resumed from classic commits
    assert _classic_join(broker.port, group) == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    described = kind()
    assert described.type == ConsumerGroupType.CONSUMER
    assert len(described.members) == 1
    assert {tp.partition for tp in described.members[0].assignment.topic_partitions} == set(
        range(4)
    )
    modern.close()

    produce(broker.bootstrap, topic, 60, 20, 4)
    back = Member(
        broker.bootstrap, group, [topic], {"group.protocol": "classic"}, commit_each=True
    ).start()
    try:
        wait_for(lambda: back.count() >= 20, "the classic member again")
        assert sorted(values([back])) == list(range(60, 80))
    finally:
        back.close()


def test_kafscale_groups_shows_consumer_groups(local_only: BrokerProcess) -> None:
    import io

    from broker.cli_groups import main

    broker = local_only
    topic, group = unique_topic("kip848-cli"), f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, 2)
    produce(broker.bootstrap, topic, 0, 10, 2)
    m = Member(broker.bootstrap, group, [topic], commit_each=True).start()
    try:
        wait_for(lambda: m.count() >= 10 and len(m.assignment()) == 2, "the member")
        member_id = describe(broker.port, group).members[0].member_id

        def cli(*argv: str) -> str:
            out, err = io.StringIO(), io.StringIO()
            assert main([*argv, "--bootstrap", broker.bootstrap], out=out, err=err) == 0
            return out.getvalue()

        wait_for(lambda: cli("describe", group).count(member_id) == 2, "both rows owned")
        rows = [r.split() for r in cli("describe", group).splitlines() if r.startswith(group)]
        assert sorted((r[1], r[2], r[3]) for r in rows) == [(topic, "0", "5"), (topic, "1", "5")]
        listed = [r.split() for r in cli("list", "--state").splitlines()]
        assert [group, "Stable", "consumer"] in listed
    finally:
        m.close()


def test_group_moves_to_a_new_coordinator(tmp_path: Path, etcd_url: str) -> None:
    """Two brokers on one etcd and one store: a consumer group whose coordinator changes
    when the second broker joins is reloaded there from the metadata store, and its
    member keeps its member id, epoch and partitions."""
    from broker.cluster import BrokerInfo, rendezvous

    def coordinator_of(group: str, nodes: list[int]) -> int:
        best = rendezvous(f"g\x00{group}", [BrokerInfo(n, "", 0) for n in nodes])
        assert best is not None
        return best.node_id

    group = next(
        g
        for g in (f"g-move-{i}" for i in range(1000))
        if coordinator_of(g, [1]) == 1 and coordinator_of(g, [1, 2]) == 2
    )
    store_url = f"file://{tmp_path / 'store'}"
    # DEBUG: a heartbeat a broker refuses is logged (shown below if this test fails)
    prefix = ("--meta-prefix", f"/kip848-{uuid.uuid4().hex[:8]}", "--log-level", "DEBUG",
              *KIP848_ARGS)  # fmt: skip
    one = start_broker(
        tmp_path / "n1", node_id=1, extra_args=prefix, store_url=store_url, meta_url=etcd_url
    )
    two: BrokerProcess | None = None
    m: Member | None = None
    try:
        topic = unique_topic("kip848-move")
        create_topic(one.bootstrap, topic, 4)
        # librdkafka's group log goes to the captured stderr, shown if this test fails
        m = Member(
            one.bootstrap, group, [topic], {"debug": "cgrp"}, commit_each=True,
            watch_coordinator=True,
        ).start()  # fmt: skip
        wait_for(lambda: len(m.assignment()) == 4, "the member owning every partition")
        before = describe(one.port, group)
        two = start_broker(
            tmp_path / "n2", node_id=2, extra_args=prefix, store_url=store_url, meta_url=etcd_url
        )
        wait_for(
            lambda: describe(two.port, group).error_code == 0,
            "the second broker coordinating the group",
        )
        after = describe(two.port, group)
        assert [x.member_id for x in after.members] == [x.member_id for x in before.members]
        assert describe(one.port, group).error_code == ErrorCode.NOT_COORDINATOR
        # The member's client finds the new coordinator through its heartbeats before it
        # commits anything there. A synchronous commit answered NOT_COORDINATOR by the old
        # coordinator can leave librdkafka 2.16 retrying it through one coordinator reset
        # after another, its heartbeats lost with them, until the new coordinator ends the
        # member's session (seen in CI; docs/compatibility.md, "KIP-848 consumer groups")
        wait_for(
            lambda: m.coordinator() == (f"127.0.0.1:{two.port}", "UP"),
            "the member's client connected to the new coordinator",
        )
        produce(one.bootstrap, topic, 0, 40, 4)
        wait_for(lambda: m.count() >= 40, "records after the move")
        assert sorted(values([m])) == list(range(40))
        assert m.errors == []
        final = describe(two.port, group)
        assert final.members[0].member_epoch >= before.members[0].member_epoch
        assert final.group_state == "Stable"
    except BaseException:
        for b in (one, two):  # what each coordinator saw, in the failure's captured output
            if b is not None:  # without grpc's line per etcd call
                lines = [x for x in b.log_text().splitlines() if " DEBUG grpc." not in x]
                print(f"--- broker {b.port} log ---", *lines[-300:], sep="\n")
        raise
    finally:
        try:
            if m is not None:
                m.close()
        finally:  # the brokers are stopped even if the member failed to close
            for b in (two, one):
                if b is not None:
                    b.stop()


def test_delete_consumer_group(local_only: BrokerProcess) -> None:
    from confluent_kafka.admin import AdminClient

    broker = local_only
    topic, group = unique_topic("kip848-del"), f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, 2)
    produce(broker.bootstrap, topic, 0, 10, 2)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})

    def delete() -> Any:
        (fut,) = admin.delete_consumer_groups([group], request_timeout=30).values()
        return fut.exception(timeout=30)

    m = Member(broker.bootstrap, group, [topic], commit_each=True).start()
    try:
        wait_for(lambda: m.count() >= 10, "the member reading")
        refused = delete()
        assert refused is not None and "NON_EMPTY_GROUP" in str(refused)
    finally:
        m.close()
    assert delete() is None
    assert describe(broker.port, group).error_code == ErrorCode.GROUP_ID_NOT_FOUND
    again = Member(broker.bootstrap, group, [topic], commit_each=True).start()
    try:  # offsets went with the group: a new member starts from the beginning
        wait_for(lambda: again.count() >= 10, "the records again")
        assert sorted(values([again])) == list(range(10))
    finally:
        again.close()
