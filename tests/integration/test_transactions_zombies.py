"""Zombies of the transaction paths, on SeaweedFS (S3) + etcd: a broker frozen at a
fault checkpoint of a transaction (docs/operations.md, "Fault tests") while another
broker takes its work over, then woken. What it does late must change nothing:

- a partition owner frozen after appending the abort marker an admin's
  ``abortTransaction`` (WriteTxnMarkers, KIP-664) asked for, before committing it: the new
  owner takes the open transaction over and aborts it; the woken zombie's marker is
  fenced, so the partition holds exactly one abort marker and every acknowledged record
  at its offset;
- a transaction coordinator frozen just before deleting a transactional id it found idle
  past ``transactional.id.expiration.ms``: meanwhile the id is used again through another
  broker; the zombie's compare-and-set delete fails, and the new transaction commits.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration import kafka_raw as kr
from tests.integration.conftest import create_topic, unique_topic
from tests.integration.test_transactions import consume_all, txn_producer
from tests.integration.test_transactions_cluster import txn_id_coordinated_by
from tests.integration.zombie_cluster import (
    RETRIABLE,
    WAIT,
    ZCluster,
    make_backend,
    running,
    topic_owned_by,
)

pytestmark = pytest.mark.integration

ABORT_KEY = b"\x00\x00\x00\x00"  # control record key: version 0, type 0 (abort)


def _wait_log(c: ZCluster, node: int, *needles: str) -> str:
    """Wait until broker ``node``'s log holds one of ``needles``; returns it."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:  # another process's log: polled
        text = c.brokers[node].log_text()
        for n in needles:
            if n in text:
                return n
        time.sleep(0.1)
    raise AssertionError(f"node {node} never logged {needles}:\n{text[-3000:]}")


def _fetch_all(c: ZCluster, topic: str) -> kr.Fetched:
    """Every record (control records included) of partition 0, from its live leader
    (the woken broker takes it back once it registered again)."""
    deadline = time.monotonic() + WAIT
    while True:
        got = kr.fetch_all(c.brokers[c.leader(topic, 0, deadline)].port, topic, 0)
        if got.error_code == 0:
            return got
        assert got.error_code in RETRIABLE and time.monotonic() < deadline, got
        time.sleep(0.1)


def _abort_spec(bootstrap: str, topic: str) -> Any:
    """kafka-python's AbortTransactionSpec for the one open transaction on partition 0
    (DescribeProducers on its leader)."""
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KTP
    from kafka.admin import AbortTransactionSpec

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        state = admin.describe_producers([KTP(topic, 0)])[KTP(topic, 0)]
    finally:
        admin.close()
    (active,) = state.active_producers
    return AbortTransactionSpec(
        topic_partition=KTP(topic, 0),
        producer_id=active.producer_id,
        producer_epoch=active.producer_epoch,
        coordinator_epoch=active.coordinator_epoch,
    )


def _abort(bootstrap: str, spec: Any, out: dict[str, Any]) -> None:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=120_000)
    try:
        admin.abort_transaction(spec)
        out["ok"] = True
    except Exception as exc:  # the zombie's answer, after it woke: recorded, not raised
        out["error"] = repr(exc)
    finally:
        admin.close()


def test_admin_abort_on_a_frozen_owner(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    backend = make_backend(request, "s3", tmp_path)
    victim, other = 2, 1
    with running(ZCluster(tmp_path, backend)) as c:
        c.start(other)
        c.start(victim, pause_at="txn.before_marker_commit")
        topic = topic_owned_by(unique_topic("txn-zabort"), victim, [1, 2])
        create_topic(c.brokers[other].bootstrap, topic, 1)
        acked = c.produce(topic, 0, [f"a{i}".encode() for i in range(3)])
        tid = txn_id_coordinated_by(other, [1, 2])  # the coordinator stays awake
        p = txn_producer(",".join(b.bootstrap for b in c.brokers.values()), tid)
        p.begin_transaction()
        for i in range(10):
            p.produce(topic, value=f"h{i}".encode(), partition=0)
        p.flush(30)  # appended and acknowledged, never ended by its producer
        spec = _abort_spec(c.brokers[victim].bootstrap, topic)
        late: dict[str, Any] = {}
        zombie_abort = threading.Thread(
            target=_abort, args=(c.brokers[victim].bootstrap, spec, late), daemon=True
        )
        zombie_abort.start()
        c.wait_frozen_at_checkpoint(victim, "txn.before_marker_commit")
        # the lease runs out; the other broker takes partition 0 and its open transaction
        acked |= c.produce(topic, 0, [f"b{i}".encode() for i in range(3)])
        assert c.leader(topic, 0, time.monotonic() + WAIT) == other
        done: dict[str, Any] = {}
        _abort(c.brokers[other].bootstrap, _abort_spec(c.brokers[other].bootstrap, topic), done)
        assert done.get("ok"), done
        c.wake(victim)
        zombie_abort.join(WAIT * 2)
        assert not zombie_abort.is_alive()
        _wait_log(c, victim, "fenced", "lease expired")
        acked |= c.produce(topic, 0, [f"c{i}".encode() for i in range(2)])

        got = _fetch_all(c, topic)
        offsets = [o for o, _k, _v in got.records]
        assert offsets == list(range(len(offsets))), offsets
        where = {v: o for o, _k, v in got.records}
        assert {v: where.get(v) for v in acked} == acked  # every ack at its offset
        markers = [(o, k) for o, k, _v in got.records if k is not None and len(k) == 4]
        assert [k for _o, k in markers] == [ABORT_KEY], markers  # the zombie's never landed
        assert sorted(v for _o, k, v in got.records if v and v.startswith(b"h")) == sorted(
            f"h{i}".encode() for i in range(10)
        )
        bootstrap = ",".join(b.bootstrap for b in c.brokers.values())
        committed = consume_all(bootstrap, topic, 1, "read_committed", 8)
        assert sorted(v for _p, _o, v in committed) == sorted(acked)


def test_expiry_by_a_frozen_coordinator(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    from kafka import KafkaAdminClient

    backend = make_backend(request, "s3", tmp_path)
    victim, other = 2, 1
    expiry = ("--transactional-id-expiration-ms", "3000")
    with running(ZCluster(tmp_path, backend)) as c:
        c.start(other, *expiry)
        c.start(victim, *expiry, pause_at="txn.before_expire")
        topic = unique_topic("txn-zexpire")
        create_topic(c.brokers[other].bootstrap, topic, 1)
        tid = txn_id_coordinated_by(victim, [1, 2])
        p1 = txn_producer(",".join(b.bootstrap for b in c.brokers.values()), tid)
        p1.begin_transaction()
        for i in range(5):
            p1.produce(topic, value=f"t1-{i}".encode(), partition=0)
        p1.commit_transaction(60)
        del p1
        # idle past the expiration: the coordinator decides to delete the id, and freezes
        c.wait_frozen_at_checkpoint(victim, "txn.before_expire")
        p2 = txn_producer(c.brokers[other].bootstrap, tid)  # the id, used again
        p2.begin_transaction()
        for i in range(5):
            p2.produce(topic, value=f"t2-{i}".encode(), partition=0)
        p2.flush(30)
        c.wake(victim)
        found = _wait_log(c, victim, "not expired: changed since", f"{tid!r} expired")
        admin = KafkaAdminClient(bootstrap_servers=c.brokers[other].bootstrap)
        try:
            (desc,) = admin.describe_transactions([tid]).values()
        finally:
            admin.close()
        assert desc.state.value == "Ongoing"
        p2.commit_transaction(60)
        got = consume_all(c.brokers[other].bootstrap, topic, 1, "read_committed", 10)
        want = [f"t{n}-{i}".encode() for n in (1, 2) for i in range(5)]
        assert sorted(v for _p, _o, v in got) == sorted(want)
        assert found.startswith("not expired"), found
