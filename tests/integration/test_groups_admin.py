"""Group admin through real clients: confluent-kafka's AdminClient, kafka-python's
KafkaAdminClient, and the ``kafscale groups`` CLI (as a subprocess and in-process)."""

from __future__ import annotations

import io
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from broker.cli_groups import main as groups_main
from tests.fixtures.broker import BrokerProcess, start_broker
from tests.integration.conftest import unique_topic
from tests.integration.group_member import (
    MemberProc,
    committed,
    create_topic,
    produce,
    start_member,
    wait_until,
)

pytestmark = pytest.mark.integration

PARTITIONS = 3


@dataclass
class ActiveGroup:
    broker: BrokerProcess
    topic: str
    group: str
    member: MemberProc


@pytest.fixture(scope="module")
def active(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ActiveGroup]:
    """One broker; a group with one confluent member that consumed and committed 30 records."""
    work = tmp_path_factory.mktemp("groups-admin")
    broker = start_broker(work / "broker")
    member: MemberProc | None = None
    try:
        topic, group = f"adm-{uuid.uuid4().hex[:8]}", "admin-group"
        create_topic(broker.bootstrap, topic, PARTITIONS)
        produce(broker.bootstrap, topic, PARTITIONS, 30)
        member = start_member("confluent", broker.bootstrap, topic, group, work, "m")
        wait_until(lambda: len(member.records()) == 30, 60, "30 records consumed")
        wait_until(
            lambda: committed(broker.bootstrap, group) == {0: 10, 1: 10, 2: 10}, 30, "commits"
        )
        yield ActiveGroup(broker, topic, group, member)
    finally:
        if member is not None and member.proc.poll() is None:
            member.kill9()
        broker.stop()


def cli(bootstrap: str, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = groups_main(["--bootstrap", bootstrap, *args], out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


def test_confluent_admin_on_active_group(active: ActiveGroup) -> None:
    admin = AdminClient({"bootstrap.servers": active.broker.bootstrap})
    listed = admin.list_consumer_groups().result(30)
    mine = [g for g in listed.valid if g.group_id == active.group]
    assert len(mine) == 1 and mine[0].state.name == "STABLE"
    assert not mine[0].is_simple_consumer_group
    desc = admin.describe_consumer_groups([active.group])[active.group].result(30)
    assert desc.state.name == "STABLE" and desc.partition_assignor in ("range", "roundrobin")
    (m,) = desc.members
    assert m.client_id == "member-confluent" and m.host == "/127.0.0.1"
    assert sorted(tp.partition for tp in m.assignment.topic_partitions) == [0, 1, 2]
    req = [ConsumerGroupTopicPartitions(active.group)]
    offsets = admin.list_consumer_group_offsets(req)[active.group].result(30)
    assert {tp.partition: tp.offset for tp in offsets.topic_partitions} == {0: 10, 1: 10, 2: 10}
    ends = admin.list_offsets(
        {TopicPartition(active.topic, p): OffsetSpec.latest() for p in range(PARTITIONS)}
    )
    assert {tp.partition: f.result(30).offset for tp, f in ends.items()} == {0: 10, 1: 10, 2: 10}
    with pytest.raises(KafkaException, match="NON_EMPTY_GROUP"):
        admin.delete_consumer_groups([active.group])[active.group].result(30)


def test_kafka_python_admin_on_active_group(active: ActiveGroup) -> None:
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KTP

    admin = KafkaAdminClient(bootstrap_servers=active.broker.bootstrap)
    try:
        groups = {g["group_id"]: g for g in admin.list_groups()}
        assert groups[active.group]["protocol_type"] == "consumer"
        assert active.group in {g["group_id"] for g in admin.list_groups(states_filter=["Stable"])}
        assert active.group not in {
            g["group_id"] for g in admin.list_groups(states_filter=["Empty"])
        }
        desc = admin.describe_groups([active.group])[active.group]
        assert desc["group_state"] == "Stable" and len(desc["members"]) == 1
        got = admin.list_group_offsets(active.group)[active.group]
        assert {tp.partition: om.offset for tp, om in got.items()} == {0: 10, 1: 10, 2: 10}
        res = admin.delete_group_offsets(active.group, [KTP(active.topic, 0)])
        assert res[KTP(active.topic, 0)].__name__ == "GroupSubscribedToTopicError"
        assert admin.delete_groups([active.group])[active.group] == "NonEmptyGroupError"
        assert admin.delete_groups(["no-such-group"])["no-such-group"] == "GroupIdNotFoundError"
    finally:
        admin.close()


def test_cli_describe_and_list_active_group(active: ActiveGroup) -> None:
    bs = active.broker.bootstrap
    rc, out, _ = cli(bs, "list")
    assert rc == 0 and active.group in out.split()
    rc, out, _ = cli(bs, "list", "--state", "Stable")
    assert rc == 0 and any(
        ln.split() == [active.group, "Stable", "classic"] for ln in out.splitlines()
    )
    # as users run it: the kafscale console entry point in a subprocess
    proc = subprocess.run(
        [sys.executable, "-m", "broker.cli", "groups", "describe", active.group, "--bootstrap", bs],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [ln.split() for ln in proc.stdout.splitlines() if ln.strip()]
    assert lines[0] == (
        "GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID".split()
    )
    rows = {int(r[2]): r for r in lines[1:]}
    assert sorted(rows) == [0, 1, 2]
    for r in rows.values():
        assert r[0] == active.group and r[1] == active.topic
        assert r[3:6] == ["10", "10", "0"]
        assert r[6].startswith("member-confluent-") and r[7] == "/127.0.0.1"
        assert r[8] == "member-confluent"
    rc, _, err = cli(
        bs, "reset-offsets", active.group, "--topic", active.topic, "--to-earliest", "--execute"
    )
    assert rc == 1 and "inactive" in err and "Stable" in err


def test_cli_reset_and_delete_after_members_leave(active: ActiveGroup) -> None:
    bs, group, topic = active.broker.bootstrap, active.group, active.topic
    assert active.member.stop() == 0
    wait_until(lambda: "Empty" in cli(bs, "list", "--state")[1], 30, "the group to empty")
    produce(bs, topic, PARTITIONS, 30)  # log end 20 now; lag 10 per partition
    rc, out, _ = cli(bs, "describe", group)
    assert rc == 0 and "has no active members" in out
    rows = [ln.split() for ln in out.splitlines() if ln.startswith(group)]
    assert [r[3:9] for r in rows] == [["10", "20", "10", "-", "-", "-"]] * 3
    # a dry run prints the plan and changes nothing
    rc, out, _ = cli(bs, "reset-offsets", group, "--topic", topic, "--to-earliest")
    assert rc == 0 and "dry run" in out
    assert [ln.split()[3] for ln in out.splitlines() if ln.startswith(group)] == ["0"] * 3
    assert committed(bs, group) == {0: 10, 1: 10, 2: 10}
    rc, _, _ = cli(
        bs, "reset-offsets", group, "--topic", f"{topic}:1", "--to-offset", "3", "--execute"
    )
    assert rc == 0 and committed(bs, group) == {0: 10, 1: 3, 2: 10}
    rc, _, _ = cli(bs, "reset-offsets", group, "--topic", topic, "--to-latest", "--execute")
    assert rc == 0 and committed(bs, group) == {0: 20, 1: 20, 2: 20}
    rc, out, _ = cli(
        bs, "reset-offsets", group, "--topic", topic, "--to-datetime", "2000-01-01T00:00:00"
    )
    assert (
        rc == 0 and [ln.split()[3] for ln in out.splitlines() if ln.startswith(group)] == ["0"] * 3
    )
    rc, out, _ = cli(bs, "reset-offsets", group, "--topic", topic, "--to-offset", "999")
    assert [ln.split()[3] for ln in out.splitlines() if ln.startswith(group)] == ["20"] * 3
    rc, out, _ = cli(bs, "delete", group)
    assert rc == 0 and "successful" in out
    rc, _, err = cli(bs, "delete", group)
    assert rc == 1 and "GroupIdNotFoundError" in err
    rc, _, err = cli(bs, "describe", group)
    assert rc == 1 and "does not exist" in err
    admin = AdminClient({"bootstrap.servers": bs})
    assert group not in [g.group_id for g in admin.list_consumer_groups().result(30).valid]


def test_cli_reports_unreachable_broker(tmp_path: Path) -> None:
    from tests.fixtures.broker import free_port

    rc, _, err = cli(f"127.0.0.1:{free_port()}", "list")
    assert rc == 1 and "Error" in err


def _commit(bootstrap: str, group: str, offsets: list[TopicPartition]) -> None:
    """Offsets committed by a consumer that never joins (a standalone consumer's commit)."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        consumer.commit(offsets=offsets, asynchronous=False)
    finally:
        consumer.close()


def _group_offsets(admin: AdminClient, group: str) -> dict[tuple[str, int], int]:
    (fut,) = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)]).values()
    return {(tp.topic, tp.partition): tp.offset for tp in fut.result(30).topic_partitions}


def test_deleting_a_topic_deletes_every_groups_offsets_of_it(any_broker: BrokerProcess) -> None:
    """As in Kafka: a deleted topic's committed offsets leave every group, so a consumer of a
    topic re-created under the name does not resume at the old incarnation's offsets."""
    bootstrap = any_broker.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    gone, kept = unique_topic("gone"), unique_topic("kept")
    create_topic(bootstrap, gone, 2)
    create_topic(bootstrap, kept, 1)
    g1, g2 = unique_topic("g1"), unique_topic("g2")
    _commit(bootstrap, g1, [TopicPartition(gone, 0, 5), TopicPartition(gone, 1, 7)])
    _commit(bootstrap, g1, [TopicPartition(kept, 0, 3)])
    _commit(bootstrap, g2, [TopicPartition(gone, 0, 2)])
    assert _group_offsets(admin, g1) == {(gone, 0): 5, (gone, 1): 7, (kept, 0): 3}

    (fut,) = admin.delete_topics([gone], request_timeout=30).values()
    fut.result(30)

    assert _group_offsets(admin, g1) == {(kept, 0): 3}
    assert _group_offsets(admin, g2) == {}
    create_topic(bootstrap, gone, 2)  # the re-created topic starts without them
    _commit(bootstrap, g2, [TopicPartition(gone, 1, 1)])
    assert _group_offsets(admin, g2) == {(gone, 1): 1}
