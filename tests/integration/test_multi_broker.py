"""Several brokers on one etcd and one shared store (docs/architecture.md, ownership).

Brokers with different node ids and ports (``--lease-ttl 2``) share a real etcd and a
shared directory store. Metadata from any broker names every broker and the same leaders;
clients bootstrapped at one broker reach partitions owned by others; SIGTERM hands
partitions off cleanly; ``kill -9`` loses a broker's partitions until its lease expires,
then another broker takes over with every acknowledged record intact; a broker that joins
takes some partitions over (HPA scale-out).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from protocol.errors import ErrorCode
from protocol.records import build_batch
from tests.fixtures.broker import BrokerProcess, free_port, start_broker
from tests.fixtures.processes import stop_parent_then_children
from tests.integration import kafka_raw as kr
from tests.integration.backends import consume_all
from tests.integration.deliveries import acked_at, missing
from tests.integration.logcheck import Backend, check_partition

pytestmark = pytest.mark.integration

LEASE_TTL = 2
REPO = Path(__file__).resolve().parents[2]
WAIT = 20.0


class Cluster:
    def __init__(self, tmp: Path, etcd: str) -> None:
        self.tmp = tmp
        self.backend = Backend(
            "shared", f"file://{tmp / 'store'}", etcd, meta_prefix=f"/ks-{uuid.uuid4().hex[:8]}"
        )
        self.brokers: dict[int, BrokerProcess] = {}

    def start(self, node_id: int, *extra: str) -> BrokerProcess:
        b = start_broker(
            self.tmp / f"node-{node_id}",
            store_url=self.backend.store_url,
            meta_url=self.backend.meta_url,
            node_id=node_id,
            extra_args=(*self.backend.broker_args(), "--lease-ttl", str(LEASE_TTL), *extra),
        )
        self.brokers[node_id] = b
        return b

    def alive(self) -> dict[int, BrokerProcess]:
        return {
            n: b for n, b in self.brokers.items() if b.proc is not None and b.proc.poll() is None
        }

    def leaders(self, node_id: int, topic: str) -> tuple[set[int], dict[int, int]]:
        """(broker ids, partition -> leader) from broker ``node_id``'s Metadata."""
        md = kr.metadata(self.brokers[node_id].port, [topic])
        (t,) = md.topics
        assert t.error_code == 0, t
        return {b.node_id for b in md.brokers}, {
            p.partition_index: p.leader_id for p in t.partitions
        }

    def wait_agree_on(self, node_id: int, topic: str, want: set[int]) -> dict[int, int]:
        """Wait until broker ``node_id`` alone lists exactly ``want`` (others may be frozen)."""
        return self.wait_agree(topic, want, [node_id])

    def wait_agree(
        self, topic: str, want: set[int], nodes: list[int] | None = None
    ) -> dict[int, int]:
        """Wait until every live broker lists exactly ``want`` and the same leaders."""
        deadline = time.monotonic() + WAIT
        last: Any = None
        while time.monotonic() < deadline:  # polling other processes' views
            views = [self.leaders(n, topic) for n in (nodes or self.alive())]
            last = views
            if all(ids == want for ids, _ in views) and all(v[1] == views[0][1] for v in views):
                if set(views[0][1].values()) <= want:
                    return views[0][1]
            time.sleep(0.1)
        raise AssertionError(f"brokers never agreed on {want}: {last}")


@pytest.fixture
def cluster(tmp_path: Path, etcd_url: str) -> Iterator[Cluster]:
    c = Cluster(tmp_path, etcd_url)
    try:
        yield c
    finally:
        for b in c.brokers.values():
            if b.proc is not None and b.proc.poll() is None:
                os.kill(b.pid, signal.SIGCONT)  # a test may leave one stopped
            b.stop(timeout=15)
        for n, b in c.brokers.items():
            print(f"--- node {n} ---\n{b.log_text()[-4000:]}")
    for b in c.brokers.values():
        assert "Traceback" not in b.log_text()


def _create(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions)])[topic].result(15)


class Tracker:
    """A confluent-kafka producer that records every acknowledged (partition, offset)."""

    def __init__(self, bootstrap: str) -> None:
        self.acked: dict[bytes, tuple[int, int]] = {}
        self.errors: list[str] = []
        self.p = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 40000,
                "retry.backoff.ms": 100,
                "topic.metadata.refresh.interval.ms": 500,
                "enable.idempotence": True,  # sequences must survive every ownership move
                "log_level": 0,
            }
        )

    def _cb(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            self.acked[msg.value() or b""] = acked_at(msg)
        else:
            self.errors.append(str(err))

    def send(self, topic: str, prefix: str, n: int, partitions: int) -> None:
        for i in range(n):
            self.p.produce(
                topic,
                value=f"{prefix}-{i}".encode(),
                partition=i % partitions,
                on_delivery=self._cb,
            )
        assert self.p.flush(60) == 0
        assert not self.errors, self.errors[:5]

    def send_during(self, topic: str, prefix: str, partitions: int, action: Any) -> int:
        """Produce at a steady pace while ``action`` runs in another thread; return count."""
        th = threading.Thread(target=action)
        th.start()
        i = 0
        while th.is_alive() or i < 2000:
            for _ in range(50):
                self.p.produce(
                    topic,
                    value=f"{prefix}-{i}".encode(),
                    partition=i % partitions,
                    on_delivery=self._cb,
                )
                i += 1
            self.p.poll(0.01)
        th.join()
        assert self.p.flush(60) == 0
        assert not self.errors, self.errors[:5]
        return i


def _check_all(c: Cluster, bootstrap: str, topic: str, parts: int, t: Tracker) -> None:
    got = consume_all(bootstrap, topic, parts, len(t.acked), timeout=40)
    where = {v: (p, o) for p, recs in got.items() for o, _k, v in recs if v is not None}
    for p, recs in got.items():
        assert [o for o, _, _ in recs] == list(range(len(recs))), f"partition {p} has gaps"
    total = sum(len(recs) for recs in got.values())
    assert total == len(t.acked), f"{total} records for {len(t.acked)} acked: duplicates"
    lost = missing(t.acked, where)
    assert not lost, f"{len(lost)} acknowledged records lost or moved: {list(lost.items())[:5]}"
    for p in range(parts):
        check_partition(c.backend, topic, p)


def test_metadata_agrees_and_clients_reach_every_owner(cluster: Cluster) -> None:
    for n in (1, 2, 3):
        cluster.start(n)
    topic = "spread"
    _create(cluster.brokers[2].bootstrap, topic, 6)
    leaders = cluster.wait_agree(topic, {1, 2, 3})
    assert len(set(leaders.values())) >= 2, leaders  # spread over brokers
    t = Tracker(cluster.brokers[1].bootstrap)
    t.send(topic, "a", 300, 6)
    # a consumer bootstrapped at another broker reads everything back
    _check_all(cluster, cluster.brokers[3].bootstrap, topic, 6, t)
    # and a group member (coordinator found through any broker) gets every partition
    c = Consumer(
        {
            "bootstrap.servers": cluster.brokers[2].bootstrap,
            "group.id": "spread-group",
            "auto.offset.reset": "earliest",
            "log_level": 0,
        }
    )
    seen: set[bytes] = set()
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + 40
        while len(seen) < 300 and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                if m.error() is None:
                    seen.add(m.value() or b"")
        c.commit(asynchronous=False)
    finally:
        c.close()
    assert seen == set(t.acked)
    # the owner keys in etcd match the leaders every broker reports
    for p, leader in leaders.items():
        owner = _owner(cluster, topic, p)
        assert owner is not None and owner["broker"] == leader
    # a non-owner answers NOT_LEADER_OR_FOLLOWER
    p0_leader = leaders[0]
    other = next(n for n in (1, 2, 3) if n != p0_leader)
    res = kr.produce_raw(cluster.brokers[other].port, topic, 0, build_batch([(None, b"x", None)]))
    assert res.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    md = kr.metadata(cluster.brokers[other].port, [topic])
    epochs = {p.partition_index: p.leader_epoch for p in md.topics[0].partitions}
    assert all(e >= 1 for e in epochs.values()), epochs


def _owner(c: Cluster, topic: str, partition: int) -> dict[str, int] | None:
    import asyncio

    from broker.meta.base import open_meta

    async def get() -> Any:
        meta = open_meta(c.backend.meta_url, prefix=c.backend.meta_prefix)
        try:
            return await meta.get(f"/owners/{topic}/{partition}")
        finally:
            await meta.close()

    kv = asyncio.run(get())
    return None if kv is None else json.loads(kv.value)


def test_sigterm_hands_partitions_off(cluster: Cluster) -> None:
    for n in (1, 2, 3):
        cluster.start(n)
    topic = "handoff"
    _create(cluster.brokers[1].bootstrap, topic, 6)
    leaders = cluster.wait_agree(topic, {1, 2, 3})
    victim = next(n for n in (3, 2) if n in leaders.values())
    survivor = 1 if victim != 1 else 2
    t = Tracker(cluster.brokers[survivor].bootstrap)
    t.send(topic, "before", 300, 6)
    codes: list[int | None] = []
    t.send_during(topic, "during", 6, lambda: codes.append(cluster.brokers[victim].stop()))
    assert codes == [0]
    after = cluster.wait_agree(topic, {1, 2, 3} - {victim})
    moved = [p for p, n in leaders.items() if n == victim]
    assert all(after[p] != victim for p in moved)
    t0 = time.monotonic()
    t.send(topic, "after", 300, 6)
    assert time.monotonic() - t0 < 30
    _check_all(cluster, cluster.brokers[survivor].bootstrap, topic, 6, t)
    log = cluster.brokers[victim].log_text()
    assert "shutting down" in log


def test_kill9_partitions_move_after_lease_expiry(cluster: Cluster) -> None:
    for n in (1, 2, 3):
        cluster.start(n)
    topic = "crash"
    _create(cluster.brokers[1].bootstrap, topic, 6)
    leaders = cluster.wait_agree(topic, {1, 2, 3})
    victim = next(n for n in (2, 3) if n in leaders.values())
    survivor = 1 if victim != 1 else 3
    t = Tracker(cluster.brokers[survivor].bootstrap)
    t.send(topic, "before", 300, 6)
    lost = [p for p, n in leaders.items() if n == victim]
    early: list[int] = []

    def crash() -> None:
        time.sleep(0.3)  # let the steady load run first
        cluster.brokers[victim].kill9()
        # within the lease the dead broker still owns its partitions: nobody takes them
        res = kr.produce_raw(
            cluster.brokers[survivor].port, topic, lost[0], build_batch([(None, b"e", None)])
        )
        early.append(res.error_code)

    t0 = time.monotonic()
    t.send_during(topic, "during", 6, crash)  # flush waits for the takeover
    assert early == [ErrorCode.NOT_LEADER_OR_FOLLOWER]
    after = cluster.wait_agree(topic, {1, 2, 3} - {victim})
    took = time.monotonic() - t0
    assert took < LEASE_TTL + 15, took
    assert all(after[p] != victim for p in lost)
    t.send(topic, "after", 300, 6)
    _check_all(cluster, cluster.brokers[survivor].bootstrap, topic, 6, t)
    for p in lost:
        owner = _owner(cluster, topic, p)
        assert owner is not None and owner["broker"] == after[p] and owner["epoch"] >= 2


def test_new_broker_takes_some_partitions(cluster: Cluster) -> None:
    cluster.start(1)
    cluster.start(2)
    topic = "scale-out"
    parts = 12
    _create(cluster.brokers[1].bootstrap, topic, parts)
    before = cluster.wait_agree(topic, {1, 2})
    t = Tracker(cluster.brokers[1].bootstrap)
    t.send(topic, "two", 240, parts)
    cluster.start(3)
    after = cluster.wait_agree(topic, {1, 2, 3})
    moved = [p for p in range(parts) if after[p] == 3]
    assert moved, after
    assert all(before[p] == after[p] for p in range(parts) if p not in moved)  # minimal moves
    t.send(topic, "three", 240, parts)
    _check_all(cluster, cluster.brokers[3].bootstrap, topic, parts, t)
    for p in moved:
        owner = _owner(cluster, topic, p)
        assert owner is not None and owner["broker"] == 3


def _consecutive_free_ports(n: int) -> int:
    for _ in range(100):
        base = free_port()
        if base + n > 65535:
            continue
        try:
            for p in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
    raise RuntimeError("no run of free ports")


def test_local_cluster_launcher(tmp_path: Path) -> None:
    """deploy/local_cluster.py starts etcd + brokers that form one cluster; a broker
    killed with ``kill -9`` is reported while the other keeps serving and takes its
    partition with every record; SIGTERM then stops the rest."""
    base = _consecutive_free_ports(2)
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "deploy" / "local_cluster.py"), "--brokers", "2",
         "--base-port", str(base), "--dir", str(tmp_path / "lc"), "--lease-ttl", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
    )  # fmt: skip
    lines: list[str] = []
    pids: list[int] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the launcher bounds its own start-up (30 s per process)
            lines.append(line)
            if line.startswith("pids:") or line.startswith("error"):
                break
        assert any(ln.startswith("ready: bootstrap") for ln in lines), lines
        pids += [int(x) for x in lines[-1].split() if x.isdigit()]
        assert len(pids) == 3
        port = base + 1
        ids = {b.node_id for b in kr.metadata(port, ["lc-topic"]).brokers}
        assert ids == {0, 1}
        t = Tracker(f"127.0.0.1:{base}")
        t.send("lc-topic", "x", 50, 1)
        md = kr.metadata(base, ["lc-topic"])
        leader = md.topics[0].partitions[0].leader_id
        got = kr.fetch_all(base + leader, "lc-topic", 0)
        assert [v for _, _, v in got.records] == [b"x-%d" % i for i in range(50)]
        os.kill(pids[1 + leader], signal.SIGKILL)  # pids: etcd, broker 0, broker 1
        line = proc.stdout.readline()  # the launcher reports the exit, and goes on
        assert line.startswith(f"broker {leader} (pid {pids[1 + leader]}) exited with -9"), line
        other = 1 - leader
        deadline = time.monotonic() + 60  # the lease TTL (2 s) on a busy machine
        while kr.metadata(base + other, ["lc-topic"]).topics[0].partitions[0].leader_id != other:
            assert time.monotonic() < deadline, "the surviving broker never took partition 0"
            time.sleep(0.1)  # polling another process's view
        got = kr.fetch_all(base + other, "lc-topic", 0)
        assert [v for _, _, v in got.records] == [b"x-%d" % i for i in range(50)]
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        pids.clear()  # all gone: nothing left to stop by PID
    finally:  # after a failed check: the launcher first, then what it left, by PID
        stop_parent_then_children(proc, pids, 60)
        if proc.stdout is not None:
            proc.stdout.close()


def test_zombie_owner_is_fenced(cluster: Cluster) -> None:
    """A broker frozen (SIGSTOP) past its lease, with a batch buffered, wakes up after
    another broker took its partition over: its late flush must neither commit nor touch
    the new owner's objects; everything the new owner acknowledged stays readable."""
    cluster.start(1)
    # the zombie-to-be buffers for 1.5 s
    cluster.start(2, "--flush-interval-ms", "1500", "--flush-when-idle", "false")
    topic = "zombie"
    _create(cluster.brokers[1].bootstrap, topic, 8)
    leaders = cluster.wait_agree(topic, {1, 2})
    part = next(p for p, n in sorted(leaders.items()) if n == 2)
    zombie = cluster.brokers[2]
    first = kr.produce_raw(zombie.port, topic, part, build_batch([(b"k", b"before", None)]))
    assert first.error_code == 0 and first.base_offset == 0
    late = kr.RawConn(zombie.port, timeout=30)
    try:
        late.send(
            kr.request_bytes(
                kr.produce_request(topic, part, build_batch([(b"z", b"ZOMBIE", None)] * 3)), 8
            )
        )
        time.sleep(0.2)  # the zombie reads and buffers the batch (flush is 1.5 s away)
        os.kill(zombie.pid, signal.SIGSTOP)
        after = cluster.wait_agree_on(1, topic, {1})
        assert after[part] == 1
        res = kr.produce_raw(
            cluster.brokers[1].port, topic, part, build_batch([(b"k", b"new-owner", None)])
        )
        assert res.error_code == 0 and res.base_offset == 1  # continues at the log end
        os.kill(zombie.pid, signal.SIGCONT)
        data = late.recv_frame()
        if data is not None:  # an answer, if any, is an error, never an acknowledgement
            resp = kr.ProduceResponse.decode(data, version=8, header=True)
            assert resp.responses[0].partition_responses[0].error_code != 0
    finally:
        late.close()
    cluster.wait_agree(topic, {1, 2})  # the zombie re-registers and rejoins
    more = kr.produce_raw(
        cluster.brokers[cluster.leaders(1, topic)[1][part]].port,
        topic,
        part,
        build_batch([(b"k", b"later", None)]),
    )
    assert more.error_code == 0 and more.base_offset == 2
    state = check_partition(cluster.backend, topic, part)
    assert state.next_offset == 3
    leader = cluster.leaders(1, topic)[1][part]
    got = kr.fetch_all(cluster.brokers[leader].port, topic, part)
    assert [v for _, _, v in got.records] == [b"before", b"new-owner", b"later"]
    assert "fenced" in zombie.log_text() or "lease expired" in zombie.log_text()


def test_rolling_restart_under_load(cluster: Cluster) -> None:
    """A rolling update: each broker in turn gets SIGTERM and comes back, while an
    idempotent producer keeps writing; nothing acknowledged is lost or duplicated."""
    for n in (1, 2, 3):
        cluster.start(n)
    topic = "rolling"
    _create(cluster.brokers[1].bootstrap, topic, 6)
    cluster.wait_agree(topic, {1, 2, 3})
    t = Tracker(",".join(b.bootstrap for b in cluster.brokers.values()))

    def roll() -> None:
        for n in (1, 2, 3):
            time.sleep(0.3)
            assert cluster.brokers[n].stop() == 0
            cluster.brokers[n].start()

    t.send_during(topic, "roll", 6, roll)
    cluster.wait_agree(topic, {1, 2, 3})
    t.send(topic, "after", 60, 6)
    _check_all(cluster, cluster.brokers[2].bootstrap, topic, 6, t)
