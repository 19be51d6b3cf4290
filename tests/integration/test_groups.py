"""Consumer groups end to end: real broker process, real clients in their own processes.

Membership changes (join, clean leave, SIGKILL) happen while the members run; each batch
of records is produced after the group has settled, so a member is never killed holding an
uncommitted record and "exactly once" is a fair expectation of at-least-once clients.
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import pytest

from tests.fixtures.broker import BrokerProcess, broker  # noqa: F401 - fixture
from tests.integration.group_member import (
    MemberProc,
    committed,
    create_topic,
    produce,
    start_member,
    wait_until,
)

pytestmark = pytest.mark.integration

PARTITIONS = 6


def all_records(members: list[MemberProc]) -> Counter[tuple[int, int]]:
    return Counter(r for m in members for r in m.records())


def expect_consumed(members: list[MemberProc], total: int, timeout: float = 60) -> None:
    wait_until(lambda: sum(all_records(members).values()) >= total, timeout, f"{total} records")


def settled(members: list[MemberProc]) -> bool:
    """Every partition held by exactly one of the members."""
    held = [p for m in members for p in m.assigned()]
    return sorted(held) == list(range(PARTITIONS))


def stop_all(members: list[MemberProc]) -> None:
    for m in members:
        if m.proc.poll() is None:
            m.kill9()


def test_mixed_clients_join_leave_and_crash(broker: BrokerProcess, tmp_path: Path) -> None:  # noqa: F811
    bs, topic, group = broker.bootstrap, f"mixed-{uuid.uuid4().hex[:8]}", "mixed"
    create_topic(bs, topic, PARTITIONS)
    members = [
        start_member(c, bs, topic, group, tmp_path, c)
        for c in ("confluent", "kafka-python", "aiokafka")
    ]
    everyone = list(members)
    try:
        wait_until(
            lambda: settled(members) and all(m.assigned() for m in members),
            60,
            "three members sharing the partitions",
        )
        produce(bs, topic, PARTITIONS, 120, "a")
        expect_consumed(everyone, 120)

        # crash the kafka-python member; a second confluent member joins
        members[1].kill9()
        joiner = start_member("confluent", bs, topic, group, tmp_path, "confluent-2")
        everyone.append(joiner)
        members = [members[0], members[2], joiner]
        wait_until(lambda: settled(members) and bool(joiner.assigned()), 60, "rebalance")
        produce(bs, topic, PARTITIONS, 120, "b")
        expect_consumed(everyone, 240)

        # the aiokafka member leaves cleanly
        assert members[1].stop() == 0
        members = [members[0], joiner]
        wait_until(lambda: settled(members), 60, "rebalance after a clean leave")
        produce(bs, topic, PARTITIONS, 120, "c")
        expect_consumed(everyone, 360)
        for m in members:
            assert m.stop() == 0
    finally:
        stop_all(everyone)
    counts = all_records(everyone)
    assert sum(counts.values()) == 360
    assert max(counts.values()) == 1, "a record was consumed twice"
    assert set(counts) == {(p, o) for p in range(PARTITIONS) for o in range(60)}
    assert committed(bs, group) == dict.fromkeys(range(PARTITIONS), 60)


def test_cooperative_sticky_rebalances_incrementally(broker: BrokerProcess, tmp_path: Path) -> None:  # noqa: F811
    bs, topic, group = broker.bootstrap, f"coop-{uuid.uuid4().hex[:8]}", "coop"
    create_topic(bs, topic, PARTITIONS)
    opts = ("--assignor", "cooperative-sticky")
    first = start_member("confluent", bs, topic, group, tmp_path, "first", *opts)
    everyone = [first]
    try:
        wait_until(lambda: first.assigned() == set(range(PARTITIONS)), 60, "first member")
        produce(bs, topic, PARTITIONS, 60, "a")
        expect_consumed(everyone, 60)
        second = start_member("confluent", bs, topic, group, tmp_path, "second", *opts)
        everyone.append(second)
        wait_until(lambda: settled(everyone) and bool(second.assigned()), 60, "incremental")
        produce(bs, topic, PARTITIONS, 60, "b")
        expect_consumed(everyone, 120)
        for m in everyone:
            assert m.stop() == 0
    finally:
        stop_all(everyone)
    # incremental: the first member gave up only what the second took and kept the rest
    ev = [(kind, parts) for kind, parts in first.events() if parts]
    assert ev[0] == ("A", set(range(PARTITIONS)))
    kind, moved = ev[1]
    assert kind == "V" and 0 < len(moved) < PARTITIONS
    assert next(p for k, p in second.events() if k == "A" and p) == moved
    counts = all_records(everyone)
    assert sum(counts.values()) == 120 and max(counts.values()) == 1
    assert committed(bs, group) == dict.fromkeys(range(PARTITIONS), 20)


def test_static_member_rejoins_without_rebalance(broker: BrokerProcess, tmp_path: Path) -> None:  # noqa: F811
    bs, topic, group = broker.bootstrap, f"static-{uuid.uuid4().hex[:8]}", "static"
    create_topic(bs, topic, PARTITIONS)
    a = start_member(
        "confluent",
        bs,
        topic,
        group,
        tmp_path,
        "a1",
        "--instance-id",
        "inst-a",
        "--session-ms",
        "30000",
    )
    b = start_member(
        "confluent",
        bs,
        topic,
        group,
        tmp_path,
        "b",
        "--instance-id",
        "inst-b",
        "--session-ms",
        "30000",
    )
    everyone = [a, b]
    try:
        wait_until(lambda: settled([a, b]) and bool(a.assigned() and b.assigned()), 60, "two")
        held_a, b_events = a.assigned(), len(b.events())
        a.kill9()  # a crash: static members send no LeaveGroup
        a2 = start_member(
            "confluent",
            bs,
            topic,
            group,
            tmp_path,
            "a2",
            "--instance-id",
            "inst-a",
            "--session-ms",
            "30000",
        )
        everyone.append(a2)
        wait_until(lambda: a2.assigned() == held_a, 30, "the restarted member's old partitions")
        produce(bs, topic, PARTITIONS, 60)
        expect_consumed(everyone, 60)
        assert len(b.events()) == b_events, "the other member saw a rebalance"
        for m in (a2, b):
            assert m.stop() == 0
    finally:
        stop_all(everyone)
    assert committed(bs, group) == dict.fromkeys(range(PARTITIONS), 10)
