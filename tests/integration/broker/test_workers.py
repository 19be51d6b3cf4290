"""``kafscale broker --workers N`` (broker/workers.py) with real clients over TCP.

One supervisor runs two workers over a real etcd and a local-directory store; the test
checks what clients see (two brokers, partitions led by both, everything produced is
consumed), that a killed worker is restarted under the same node id, and that SIGTERM
stops every worker and the supervisor cleanly. The embedded metadata store refuses more
than one worker.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker.workers import MAX_RESTARTS
from tests.fixtures.broker import REPO, free_port
from tests.fixtures.processes import stop_parent_then_children
from tests.integration.spread import spread_topic

confluent_kafka = pytest.importorskip("confluent_kafka")
admin_mod = pytest.importorskip("confluent_kafka.admin")

DEADLINE = 60.0
NODE = 20
PARTS = 8
LEASE_TTL = 2


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


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _children(pid: int) -> set[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return {int(p) for p in f.read().split()}
    except OSError:
        return set()


def _until(cond: object, what: str, deadline: float = DEADLINE) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if callable(cond) and cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@dataclass
class Supervised:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def supervised(etcd_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervised]:
    work = tmp_path_factory.mktemp("workers")
    port = _consecutive_free_ports(4)  # PLAINTEXT port + i, EXTERNAL port + 2 + i
    log = work / "supervisor.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
    cmd = [
        sys.executable, "-m", "broker.cli", "broker", "--workers", "2",
        "--listen", f"127.0.0.1:{port}", "--advertised-listener", f"127.0.0.1:{port}",
        "--listener", f"EXTERNAL://127.0.0.1:{port + 2}",
        "--advertised-listener", f"EXTERNAL://127.0.0.1:{port + 2}",
        "--listener-security-protocol-map", "EXTERNAL:PLAINTEXT",
        "--node-id", str(NODE),
        "--meta", etcd_url, "--meta-prefix", f"/workers-{uuid.uuid4().hex[:8]}",
        "--store", f"file://{work}/objects", "--lease-ttl", str(LEASE_TTL),
        "--default-partitions", str(PARTS),
    ]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    sup = Supervised(proc, port, log)
    try:
        _until(lambda: all(_listening(port + i) for i in range(4)), "both workers to listen")
        yield sup
    finally:  # a supervisor that failed its own job leaves nothing behind
        stop_parent_then_children(proc, _children(proc.pid), 30)


def _produce(bootstrap: str, topic: str, n: int, tag: str) -> None:
    p = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
         "message.timeout.ms": int(DEADLINE * 1000), "log_level": 3}
    )  # fmt: skip
    errors: list[object] = []
    for i in range(n):
        p.produce(topic, f"{tag}-{i}".encode(), partition=i % PARTS,
                  on_delivery=lambda err, _m: errors.append(err) if err else None)  # fmt: skip
        p.poll(0)
    assert p.flush(DEADLINE) == 0
    assert errors == []


def _consume(bootstrap: str, topic: str, want: int) -> list[bytes]:
    c = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
         "auto.offset.reset": "earliest", "enable.auto.commit": False, "log_level": 3}
    )  # fmt: skip
    got: list[bytes] = []
    try:
        c.subscribe([topic])
        end = time.monotonic() + DEADLINE
        while len(got) < want and time.monotonic() < end:
            for m in c.consume(500, 1.0):
                if m.error() is None:
                    got.append(m.value())
    finally:
        c.close()
    return got


def _brokers_seen(admin: Any, want: set[int]) -> Any:
    """The metadata once it names every worker: a worker learns of one that registered
    just before it by a watch, which etcd may deliver some 100 ms later."""
    seen: list[Any] = []

    def names_all() -> bool:
        seen[:] = [admin.list_topics(timeout=30)]
        return set(seen[0].brokers) == want

    _until(names_all, f"the metadata to name brokers {sorted(want)}")
    return seen[0]


def test_clients_see_every_worker_and_lose_nothing(supervised: Supervised) -> None:
    topic = spread_topic("w", [NODE, NODE + 1], PARTS)
    admin = admin_mod.AdminClient({"bootstrap.servers": supervised.bootstrap})
    md = _brokers_seen(admin, {NODE, NODE + 1})
    admin.create_topics([admin_mod.NewTopic(topic, PARTS, 1)])[topic].result(30)
    assert {b.port for b in md.brokers.values()} == {supervised.port, supervised.port + 1}
    _produce(supervised.bootstrap, topic, 400, "a")
    leaders = {
        p.leader for p in admin.list_topics(topic, timeout=30).topics[topic].partitions.values()
    }
    assert leaders == {NODE, NODE + 1}  # partitions are spread over both workers
    got = _consume(f"127.0.0.1:{supervised.port + 1}", topic, 400)
    assert sorted(got) == sorted(f"a-{i}".encode() for i in range(400))


def test_named_listeners_get_a_port_per_worker(supervised: Supervised) -> None:
    """A client of the EXTERNAL listener is told every worker's EXTERNAL address (its port
    + the worker's index) and reads through worker 1's."""
    topic = f"x-{uuid.uuid4().hex[:6]}"
    external = f"127.0.0.1:{supervised.port + 3}"  # worker 1's EXTERNAL listener
    admin = admin_mod.AdminClient({"bootstrap.servers": external})
    md = _brokers_seen(admin, {NODE, NODE + 1})
    admin.create_topics([admin_mod.NewTopic(topic, PARTS, 1)])[topic].result(30)
    assert {b.id: b.port for b in md.brokers.values()} == {
        NODE: supervised.port + 2,
        NODE + 1: supervised.port + 3,
    }
    _produce(external, topic, 100, "x")
    got = _consume(f"127.0.0.1:{supervised.port + 2}", topic, 100)
    assert sorted(got) == sorted(f"x-{i}".encode() for i in range(100))


def test_a_killed_worker_is_restarted_and_sigterm_stops_all(supervised: Supervised) -> None:
    topic = f"k-{uuid.uuid4().hex[:6]}"
    before = _children(supervised.proc.pid)
    assert len(before) == 2
    victim = max(before)
    os.kill(victim, signal.SIGKILL)
    _until(
        lambda: (
            len(_children(supervised.proc.pid) - before) == 1
            and len(_children(supervised.proc.pid)) == 2
        ),
        "the killed worker to be replaced",
    )
    _until(lambda: _listening(supervised.port) and _listening(supervised.port + 1), "listeners")
    _produce(supervised.bootstrap, topic, 200, "b")  # the restarted worker's id is back
    got = _consume(supervised.bootstrap, topic, 200)
    assert sorted(got) == sorted(f"b-{i}".encode() for i in range(200))
    md = admin_mod.AdminClient({"bootstrap.servers": supervised.bootstrap})
    assert set(md.list_topics(timeout=30).brokers) == {NODE, NODE + 1}

    kids = _children(supervised.proc.pid)
    supervised.proc.send_signal(signal.SIGTERM)
    assert supervised.proc.wait(DEADLINE) == 0
    for pid in kids:
        assert not os.path.exists(f"/proc/{pid}") or _zombie(pid)
    text = supervised.log.read_text(errors="replace")
    assert "exited with -9" in text  # the kill was seen and logged


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def test_embedded_store_refuses_more_workers(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
    res = subprocess.run(
        [sys.executable, "-m", "broker.cli", "broker", "--workers", "2",
         "--listen", f"127.0.0.1:{free_port()}"],
        cwd=tmp_path, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=DEADLINE,
    )  # fmt: skip
    assert res.returncode == 2
    assert "--meta etcd://" in res.stderr


def test_a_worker_that_keeps_failing_stops_the_supervisor(etcd_url: str, tmp_path: Path) -> None:
    """Worker 1's port is taken: it exits at every start; after MAX_RESTARTS the
    supervisor stops worker 0 by PID and exits 1, leaving no process behind."""
    port = _consecutive_free_ports(2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
    cmd = [
        sys.executable, "-m", "broker.cli", "broker", "--workers", "2",
        "--listen", f"127.0.0.1:{port}", "--node-id", "40",
        "--meta", etcd_url, "--meta-prefix", f"/workers-{uuid.uuid4().hex[:8]}",
        "--store", f"file://{tmp_path}/objects", "--lease-ttl", str(LEASE_TTL),
    ]  # fmt: skip
    log = tmp_path / "supervisor.log"
    with socket.socket() as blocker, open(log, "wb") as out:
        blocker.bind(("127.0.0.1", port + 1))
        blocker.listen()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        seen: set[int] = set()
        try:
            # a deadline (starts are slow on a busy machine), below pytest's timeout so that
            # a hang is reported with the supervisor's log
            end = time.monotonic() + 240
            while proc.poll() is None and time.monotonic() < end:
                seen |= _children(proc.pid)
                time.sleep(0.1)
            if proc.poll() is None:
                tail = log.read_text(errors="replace")[-4000:]
                pytest.fail(f"the supervisor still runs after 240 s; its log ends:\n{tail}")
            assert proc.wait(10) == 1
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    out_text = log.read_text(errors="replace")
    assert "keeps exiting" in out_text
    assert out_text.count("worker 1 started") >= 1 + MAX_RESTARTS  # the first, then restarts
    for pid in seen:
        assert not os.path.exists(f"/proc/{pid}") or _zombie(pid)
