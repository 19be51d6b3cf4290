"""Zombies and crashes with cycle keys (broker/fold.py, docs/architecture.md "Cycle keys"):
a flush cycle commits as one key fenced by the broker's registration, and its entries
reach the partitions' own keys only when the owner folds them.

- A broker frozen just before its fold has acknowledged records that only its cycle keys
  name. Its lease expires, another broker takes the partition and must serve them (its
  take folds them); the frozen one is then woken (its fold is fenced) or killed.
- A broker frozen just before a cycle's commit, woken after another broker took the
  partition and committed other records at the same offsets: its commit is fenced by its
  registration (gone with its lease), and its producer is never told the records were
  written.

Every acknowledged record reads back from the live cluster and after a cold restart.
Two broker processes share etcd and a store (a directory, or SeaweedFS); the harness is
tests/integration/zombie_cluster.py's.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from broker.cluster import BrokerInfo, partition_key, rendezvous
from broker.meta.base import open_meta
from broker.meta.schema import cycles_prefix, parse_cycle, segments_prefix
from tests.integration.logcheck import check_partition
from tests.integration.test_zombies import (
    create,
    late_produce_of_a_zombie,
    values,
    verify,
)
from tests.integration.zombie_cluster import (
    FAST_MAINTENANCE,
    WAIT,
    ZCluster,
    assert_exactly,
    topic_owned_by,
)

pytestmark = pytest.mark.integration

CYCLES = ("--cycle-keys-min-partitions", "1")


async def _named(zc: ZCluster, topic: str, node: int) -> tuple[list[str], int]:
    """The partition's own manifest entries, and how many entries of ``topic`` the cycle
    keys of broker ``node`` hold."""
    meta = open_meta(zc.backend.meta_url, prefix=zc.backend.meta_prefix)
    try:
        own = [kv.key for kv in await meta.range(segments_prefix(topic, 0))]
        cycles = await meta.range(cycles_prefix(node))
        held = sum(e.topic == topic for kv in cycles for e in parse_cycle(kv.value)[1])
        return own, held
    finally:
        await meta.close()


@pytest.mark.parametrize("then", ["wake", "kill"])
def test_acknowledged_records_only_cycle_keys_name_survive_their_owner(
    zc: ZCluster, then: str
) -> None:
    zc.start(1, *FAST_MAINTENANCE, *CYCLES, pause_at="fold.before_commit")
    zc.start(2, *FAST_MAINTENANCE, *CYCLES)
    topic = topic_owned_by("cycles-fold", 1, [1, 2])
    create(zc.brokers[2].bootstrap, topic)
    acked = zc.produce(topic, 0, values("a", 5))
    zc.wait_frozen_at_checkpoint(1, "fold.before_commit")
    own, held = asyncio.run(_named(zc, topic, 1))
    first = min(acked.values())
    assert first == 0 and own == [] and held >= 1  # acknowledged, named by cycle keys alone
    acked |= zc.produce(topic, 0, values("b", 5))  # broker 2, once broker 1's lease is gone
    if then == "wake":
        zc.wake(1)  # its fold is fenced: the owner key it compares is broker 2's now
    else:
        b1 = zc.brokers[1]
        os.kill(b1.pid, signal.SIGKILL)
        assert b1.proc is not None
        b1.proc.wait(timeout=WAIT)
        zc.frozen.discard(1)
    verify(zc, topic, acked)


def test_zombie_cycle_commit_is_fenced_by_its_registration(zc: ZCluster) -> None:
    zc.start(1, *FAST_MAINTENANCE, *CYCLES, pause_at="cycle.before_commit")
    zc.start(2, *FAST_MAINTENANCE, *CYCLES)
    topic = topic_owned_by("cycles-commit", 1, [1, 2])
    create(zc.brokers[2].bootstrap, topic)
    acked = late_produce_of_a_zombie(zc, topic, "cycle.before_commit")
    verify(zc, topic, acked)
    _own, held = asyncio.run(_named(zc, topic, 1))
    assert held == 0  # the zombie's cycle never committed


def split_topic(prefix: str, partitions: int) -> tuple[str, list[int]]:
    """A topic name whose partitions hash to both brokers 1 and 2; the ones on 2."""
    infos = [BrokerInfo(n, "127.0.0.1", 0) for n in (1, 2)]
    for i in range(10_000):
        name = f"{prefix}-{i}"
        owners = [rendezvous(partition_key(name, p), infos) for p in range(partitions)]
        moved = [p for p, o in enumerate(owners) if o is not None and o.node_id == 2]
        if 0 < len(moved) < partitions:
            return name, moved
    raise AssertionError("no such topic name")


def test_a_hand_off_folds_and_the_next_owner_serves_everything(zc: ZCluster) -> None:
    zc.start(1, *FAST_MAINTENANCE, *CYCLES)
    topic, moved = split_topic("cycles-handoff", 4)
    create(zc.brokers[1].bootstrap, topic, 4)
    acked = {p: zc.produce(topic, p, values(f"a{p}", 3)) for p in range(4)}
    zc.start(2, *FAST_MAINTENANCE, *CYCLES)
    deadline = time.monotonic() + WAIT
    while not all(f"handed off {topic}-{p}" in zc.brokers[1].log_text() for p in moved):
        assert time.monotonic() < deadline, "broker 1 never handed its partitions off"
        time.sleep(0.1)  # another process's log: polled
    for p in range(4):
        acked[p] |= zc.produce(topic, p, values(f"b{p}", 3))
        assert_exactly(zc.read(topic, p), acked[p])
    zc.restart_all()
    for p in range(4):
        assert_exactly(zc.read(topic, p), acked[p])
        check_partition(zc.backend, topic, p)
