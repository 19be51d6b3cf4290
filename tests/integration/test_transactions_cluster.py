"""Transactions across three brokers on SeaweedFS (S3) + etcd, with ``kill -9`` of a
broker at a fault checkpoint (docs/architecture.md, "Transactions"):

- the transaction coordinator's broker, after it stored PrepareCommit and before it
  requested any marker (``txn.after_prepare``): another broker takes the transactional id
  over and completes the commit;
- a partition owner, after it appended a commit marker and before that was committed
  (``txn.before_marker_commit``): the partition's new owner finds the open transaction
  and the marker request in the metadata store and writes the marker.

Either way the transaction ends as decided (committed, or aborted in the abort case) on
every partition, and read_committed consumers see each committed record exactly once and
no aborted one.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from broker.cluster import BrokerInfo, rendezvous
from tests.integration.conftest import create_topic, unique_topic
from tests.integration.test_transactions import consume_all, txn_producer
from tests.integration.zombie_cluster import ZCluster, make_backend, running, topic_owned_by

pytestmark = pytest.mark.integration

NODES = [1, 2, 3]
RECORDS = 60
PARTITIONS = 6


def txn_id_coordinated_by(node: int, nodes: list[int]) -> str:
    infos = [BrokerInfo(n, "127.0.0.1", 0) for n in nodes]
    for i in range(10_000):
        tid = f"tx-{uuid.uuid4().hex[:6]}-{i}"
        winner = rendezvous(f"t\x00{tid}", infos)
        if winner is not None and winner.node_id == node:
            return tid
    raise AssertionError("no such transactional id")


def commit_retrying(p: Any, out: dict[str, Any], commit: bool = True) -> None:
    """commit_transaction (or abort_transaction), again while the error is retriable (the
    coordinator died)."""
    from confluent_kafka import KafkaException

    for _ in range(10):
        try:
            if commit:
                p.commit_transaction(60)
            else:
                p.abort_transaction(60)
            out["ok"] = True
            return
        except KafkaException as exc:
            out.setdefault("errors", []).append(str(exc))
            if not exc.args[0].retriable():
                return


@pytest.mark.parametrize(
    ("point", "victim", "coordinator", "commit"),
    [
        ("txn.after_prepare", 3, 3, True),
        ("txn.before_marker_commit", 3, 1, True),
        ("txn.after_prepare", 3, 3, False),
    ],
)
def test_broker_killed_mid_commit(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    point: str,
    victim: int,
    coordinator: int,
    commit: bool,
) -> None:
    backend = make_backend(request, "s3", tmp_path)
    with running(ZCluster(tmp_path, backend)) as c:
        for n in NODES:
            c.start(n, pause_at=point if n == victim else "")
        live = [n for n in NODES if n != victim]
        bootstrap = ",".join(c.brokers[n].bootstrap for n in live)
        topic = topic_owned_by(unique_topic("txn-kill"), victim, NODES)  # partition 0
        create_topic(bootstrap, topic, PARTITIONS)
        tid = txn_id_coordinated_by(coordinator, NODES)
        p = txn_producer(",".join(b.bootstrap for b in c.brokers.values()), tid)
        p.begin_transaction()
        for i in range(RECORDS):
            p.produce(topic, value=f"r{i}".encode(), partition=i % PARTITIONS)
        p.flush(30)
        out: dict[str, Any] = {}
        t = threading.Thread(target=commit_retrying, args=(p, out, commit), daemon=True)
        t.start()
        c.wait_frozen_at_checkpoint(victim, point)
        c.brokers[victim].kill9()
        c.frozen.discard(victim)
        t.join(120)
        assert out.get("ok"), out
        got = consume_all(bootstrap, topic, PARTITIONS, "read_committed", RECORDS if commit else 0)
        want = sorted(f"r{i}".encode() for i in range(RECORDS)) if commit else []
        assert sorted(v for _, _, v in got) == want
        everything = consume_all(bootstrap, topic, PARTITIONS, "read_uncommitted", RECORDS)
        assert len(everything) == RECORDS  # no record written twice


def test_owner_and_coordinator_killed_with_transaction_open(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """kill -9 of the broker that coordinates the transaction and owns partition 0 while
    the transaction is open: the new owner loads the open transaction from the metadata
    store (read_committed stays held), the new coordinator accepts the commit."""
    backend = make_backend(request, "s3", tmp_path)
    victim = 2
    with running(ZCluster(tmp_path, backend)) as c:
        for n in NODES:
            c.start(n)
        live = [n for n in NODES if n != victim]
        bootstrap = ",".join(c.brokers[n].bootstrap for n in live)
        topic = topic_owned_by(unique_topic("txn-open-kill"), victim, NODES)
        create_topic(bootstrap, topic, PARTITIONS)
        tid = txn_id_coordinated_by(victim, NODES)
        p = txn_producer(",".join(b.bootstrap for b in c.brokers.values()), tid)
        p.begin_transaction()
        for i in range(RECORDS):
            p.produce(topic, value=f"r{i}".encode(), partition=i % PARTITIONS)
        p.flush(30)
        c.brokers[victim].kill9()
        # partition 0 moves to a live broker, which must still hold read_committed
        assert consume_all(bootstrap, topic, PARTITIONS, "read_committed", 0) == []
        out: dict[str, Any] = {}
        commit_retrying(p, out)
        assert out.get("ok"), out
        got = consume_all(bootstrap, topic, PARTITIONS, "read_committed", RECORDS)
        assert sorted(v for _, _, v in got) == sorted(f"r{i}".encode() for i in range(RECORDS))
