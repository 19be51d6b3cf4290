"""Brokers on one etcd and one shared store, some of them frozen and woken: the harness of
the durability tests (test_zombies.py, test_soak_zombies.py).

``ZCluster`` starts brokers (node ids 1..n) on a ``Backend`` (a shared directory store or
SeaweedFS, with etcd), freezes them (SIGSTOP, or by themselves at a fault checkpoint,
``KAFSCALE_FAULT_PAUSE``), wakes them (SIGCONT), produces records one batch at a time to
the current leader of a partition, and reads every partition back from the live cluster.
Every process is stopped by its PID.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.cluster import BrokerInfo, rendezvous
from protocol.errors import ErrorCode
from protocol.records import build_batch
from tests.fixtures.broker import BrokerProcess, start_broker
from tests.fixtures.s3 import create_bucket
from tests.integration import kafka_raw as kr
from tests.integration.deliveries import missing
from tests.integration.logcheck import Backend

LEASE_TTL = 2
WAIT = 60.0
RETRIABLE = {
    int(ErrorCode.NOT_LEADER_OR_FOLLOWER),
    int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    int(ErrorCode.LEADER_NOT_AVAILABLE),
    int(ErrorCode.KAFKA_STORAGE_ERROR),
    int(ErrorCode.REQUEST_TIMED_OUT),
    int(ErrorCode.NOT_ENOUGH_REPLICAS),
}

# brokers merge fast and delete merged-away objects soon, so that every deleting path runs
# within a test's time: each flush commits one segment, merges join runs of 2 or more
FAST_MAINTENANCE = (
    "--merge-interval-ms",
    "200",
    "--merge-min-age-ms",
    "0",
    "--merge-min-segments",
    "2",
    "--segment-delete-grace-ms",
    "1000",
    "--flush-interval-ms",
    "2",
)


def make_backend(request: pytest.FixtureRequest, kind: str, tmp: Path) -> Backend:
    etcd = request.getfixturevalue("etcd_url")
    prefix = f"/kz-{uuid.uuid4().hex[:8]}"
    if kind == "file":
        return Backend("file-etcd", f"file://{tmp / 'store'}", etcd, meta_prefix=prefix)
    endpoint = request.getfixturevalue("seaweedfs_s3")
    bucket = create_bucket(endpoint)
    return Backend("s3-etcd", endpoint.store_url(bucket, "kafscale"), etcd, meta_prefix=prefix)


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (state T in /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


def wait_frozen_at(b: BrokerProcess, point: str, wait: float = WAIT) -> None:
    """Wait until broker process ``b`` stopped itself (SIGSTOP) at fault checkpoint
    ``point``; an AssertionError with its log's tail if it exits or never gets there."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:  # another process's state: polled
        if b.proc is not None and b.proc.poll() is not None:
            raise AssertionError(f"broker {b.port} exited:\n{b.log_text()[-3000:]}")
        if stopped(b.pid) and f"fault checkpoint {point}: pausing" in b.log_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"broker {b.port} never reached {point}:\n{b.log_text()[-3000:]}")


def topic_owned_by(prefix: str, node: int, nodes: list[int], partition: int = 0) -> str:
    """A topic name whose ``partition`` hashes to ``node`` among ``nodes``."""
    infos = [BrokerInfo(n, "127.0.0.1", 0) for n in nodes]
    for i in range(10_000):
        name = f"{prefix}-{i}"
        winner = rendezvous(f"p\x00{name}\x00{partition}", infos)
        if winner is not None and winner.node_id == node:
            return name
    raise AssertionError("no such topic name")


class ZCluster:
    def __init__(self, tmp: Path, backend: Backend) -> None:
        self.tmp = tmp
        self.backend = backend
        self.brokers: dict[int, BrokerProcess] = {}
        self.frozen: set[int] = set()

    def start(self, node_id: int, *extra: str, pause_at: str = "") -> BrokerProcess:
        """Start broker ``node_id``; with ``pause_at``, it freezes itself there (at
        ``start.before_serving`` before it listens: not waited for)."""
        b = start_broker(
            self.tmp / f"node-{node_id}",
            store_url=self.backend.store_url,
            meta_url=self.backend.meta_url,
            node_id=node_id,
            port=self.brokers[node_id].port if node_id in self.brokers else None,
            extra_args=(*self.backend.broker_args(), "--lease-ttl", str(LEASE_TTL), *extra),
            env={"KAFSCALE_FAULT_PAUSE": pause_at} if pause_at else None,
            await_listener=pause_at != "start.before_serving",
        )
        self.brokers[node_id] = b
        return b

    def close(self) -> None:
        for b in self.brokers.values():
            if b.proc is not None and b.proc.poll() is None:
                os.kill(b.pid, signal.SIGCONT)  # a test may leave one stopped
            b.stop(timeout=20)

    def live(self) -> list[int]:
        return [
            n
            for n, b in sorted(self.brokers.items())
            if b.proc is not None and b.proc.poll() is None and n not in self.frozen
        ]

    def freeze(self, node: int) -> None:
        os.kill(self.brokers[node].pid, signal.SIGSTOP)
        self.frozen.add(node)

    def wait_frozen_at_checkpoint(self, node: int, point: str) -> None:
        """Wait until broker ``node`` stopped itself at fault checkpoint ``point``."""
        wait_frozen_at(self.brokers[node], point)
        self.frozen.add(node)

    def wake(self, node: int) -> None:
        os.kill(self.brokers[node].pid, signal.SIGCONT)
        self.frozen.discard(node)

    def restart_all(self) -> None:
        """A cold restart of every broker (SIGTERM, then start again on the same ports)."""
        for n in list(self.brokers):
            if n in self.frozen:
                self.wake(n)
            self.brokers[n].stop(timeout=30)
        for n in list(self.brokers):
            self.brokers[n].env.pop("KAFSCALE_FAULT_PAUSE", None)
            self.brokers[n].await_listener = True
            self.brokers[n].start()

    def leader(self, topic: str, partition: int, deadline: float) -> int:
        """The node that live Metadata names for ``partition``, once it is a live node."""
        last = None
        while time.monotonic() < deadline:  # other processes' views: polled
            for n in self.live():
                try:
                    md = kr.metadata(self.brokers[n].port, [topic])
                except OSError:
                    continue
                (t,) = md.topics
                parts = {p.partition_index: p for p in t.partitions}
                if t.error_code == 0 and partition in parts:
                    last = parts[partition].leader_id
                    if last in self.live():
                        return int(last)
            time.sleep(0.1)
        raise AssertionError(f"no live leader for {topic}-{partition} (last seen {last})")

    def produce(self, topic: str, partition: int, values: list[bytes]) -> dict[bytes, int]:
        """Each value in a batch of its own, acknowledged by the live leader (retrying
        retriable errors); returns value -> acknowledged offset."""
        acked: dict[bytes, int] = {}
        deadline = time.monotonic() + WAIT
        for v in values:
            while True:
                node = self.leader(topic, partition, deadline)
                try:
                    res = kr.produce_raw(
                        self.brokers[node].port, topic, partition, build_batch([(None, v, None)])
                    )
                except OSError:
                    res = None
                if res is not None and res.error_code == 0:
                    acked[v] = res.base_offset
                    break
                assert res is None or res.error_code in RETRIABLE, res
                assert time.monotonic() < deadline, f"could not produce {v!r}: {res}"
                time.sleep(0.1)
        return acked

    def read(self, topic: str, partition: int) -> list[tuple[int, bytes | None]]:
        """Every record of the partition, read from its live leader (retrying retriable
        errors until the leader answers)."""
        deadline = time.monotonic() + WAIT
        while True:
            node = self.leader(topic, partition, deadline)
            try:
                got = kr.fetch_all(self.brokers[node].port, topic, partition)
            except OSError:
                got = None
            if got is not None and got.error_code == 0:
                return [(o, v) for o, _k, v in got.records]
            assert got is None or got.error_code in RETRIABLE, got
            assert time.monotonic() < deadline, f"could not read {topic}-{partition}: {got}"
            time.sleep(0.1)


def _log_tail(text: str, lines: int = 80) -> str:
    """The last ``lines`` lines of a broker log, without the reconnect chatter an outage
    repeats many times a second (what the broker decided stays visible)."""
    noise = ("etcd unavailable (", "resync failed", "watch failed (", "lease refresh failed")
    kept = [line for line in text.splitlines() if not any(n in line for n in noise)]
    return "\n".join(kept[-lines:])


@contextlib.contextmanager
def running(c: ZCluster) -> Iterator[ZCluster]:
    """Yield ``c``; then stop every broker by its PID, print the tail of each log, and
    fail if any broker logged a traceback."""
    try:
        yield c
    finally:
        c.close()
        for n, b in c.brokers.items():
            print(f"--- node {n} ---\n{_log_tail(b.log_text())}")
    for b in c.brokers.values():
        assert "Traceback" not in b.log_text()


@pytest.fixture(params=["file", "s3"])
def zc(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ZCluster]:
    """Brokers on a shared directory store or on SeaweedFS, with etcd."""
    with running(ZCluster(tmp_path, make_backend(request, request.param, tmp_path))) as c:
        yield c


def assert_exactly(records: list[tuple[int, bytes | None]], acked: dict[bytes, int]) -> None:
    """The partition holds exactly the acknowledged records, each at its offset (or
    anywhere, for one acknowledged without an offset: tests/integration/deliveries.py)."""
    offsets = [o for o, _ in records]
    assert offsets == list(range(len(records))), f"gaps or disorder: {offsets[:20]}"
    found = {v: (0, o) for o, v in records if v is not None}
    lost = missing({v: (0, o) for v, o in acked.items()}, found)
    seen = [(v, acked_o, at and at[1]) for v, ((_p, acked_o), at) in list(lost.items())[:5]]
    # (record, acknowledged offset (-1: none given), offset found or None)
    assert not lost, f"{len(lost)} acknowledged records lost or moved: {seen}"
    assert len(records) == len(acked), (
        f"{len(records)} records for {len(acked)} acknowledged; {extra_records(records, acked)}"
    )


def extra_records(records: list[tuple[int, bytes | None]], acked: dict[bytes, int]) -> str:
    """What a log holds beyond its acknowledged records: values stored twice (with their
    offsets) and values never acknowledged, the first few of each."""
    at: dict[bytes | None, list[int]] = {}
    for o, v in records:
        at.setdefault(v, []).append(o)
    twice = [(v, offs) for v, offs in at.items() if len(offs) > 1]
    unacked = [(v, offs) for v, offs in at.items() if v not in acked]
    return (
        f"{len(twice)} stored more than once {twice[:5]} (acknowledged at "
        f"{[acked.get(v) for v, _ in twice[:5] if v is not None]}); "
        f"{len(unacked)} never acknowledged {unacked[:5]}"
    )
