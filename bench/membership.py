"""What producers see while a broker joins the cluster and while one leaves it, measured
in the same run for this tree and, with ``--base-tree``, another source tree
(docs/architecture.md, "Ownership": placement counts serving brokers only).

``python -m bench.membership [--partitions P] [--topics T] [--rounds R] [--base-tree DIR]``:
per tree, a real etcd (``tests/fixtures/etcd.py``) and a shared local-directory store;
broker 1 serves a topic of ``P`` partitions (and ``T - 1`` idle topics, which every
starting broker reads before it listens). An idempotent confluent-kafka producer sends
one record to every partition every ``INTERVAL_S`` (acks=all) and times each delivery
from its ``produce()``. Then:

- ``join``: broker 2 starts, and the partitions that hash to it move there;
- ``leave``: broker 2 stops (SIGTERM), and they move back.

Per event, over the records produced from the event on until the next phase: the longest
delivery, the 99th percentile, and how many partitions had a delivery over
``SLOW_MS``; and how many partitions broker 2 led once it had joined (what moved).
Processes are stopped by PID.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.broker_run import create_topics
from bench.broker_targets import broker_env
from bench.fs_probe import new_workdir
from bench.stats import percentile

INTERVAL_S = 0.01
SETTLE_S = 4.0  # each phase: long enough for every moved partition to be produced to again
SLOW_MS = 200.0
TOPIC = "moves"


@dataclass
class Deliveries:
    """(partition, produce time, delivery time) of every delivered record."""

    rows: list[tuple[int, float, float]] = field(default_factory=list)
    failed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def between(self, start: float, end: float) -> list[tuple[int, float]]:
        """(partition, delivery ms) of the records produced in [start, end)."""
        with self.lock:
            return [(p, (d - t) * 1000) for p, t, d in self.rows if start <= t < end]


def _produce(bootstrap: str, partitions: int, out: Deliveries, stop: threading.Event) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                  "linger.ms": 5, "message.timeout.ms": 120_000, "log_level": 0})  # fmt: skip

    def report(err: Any, msg: Any) -> None:
        now = time.monotonic()
        with out.lock:
            if err is not None:
                out.failed += 1
            else:
                out.rows.append((msg.partition(), float(msg.value()), now))

    while not stop.is_set():
        sent = time.monotonic()
        for part in range(partitions):
            p.produce(TOPIC, repr(time.monotonic()).encode(), partition=part, on_delivery=report)
        p.poll(0)
        stop.wait(max(0.0, sent + INTERVAL_S - time.monotonic()))
    if p.flush(120):
        raise RuntimeError("records left undelivered")


def _broker(tree: Path | None, workdir: Path, node: int, etcd: str, log: str) -> Any:
    from tests.fixtures.broker import BrokerProcess, free_port

    (workdir / f"node-{node}").mkdir(parents=True, exist_ok=True)
    port = free_port()
    args = ["--listen", f"127.0.0.1:{port}", "--node-id", str(node), "--workers", "1",
            "--store", f"file://{workdir / 'store'}", "--meta", etcd,
            "--log-level", log]  # fmt: skip
    return BrokerProcess(workdir / f"node-{node}", port, args, broker_env(tree))


@contextmanager
def _cluster(tree: Path | None) -> Iterator[tuple[Any, Any]]:
    """etcd and two (not yet started) brokers of ``tree``; every process stopped by PID."""
    from tests.fixtures.etcd import start_etcd

    workdir = new_workdir("membership-")
    (workdir / "etcd").mkdir()
    etcd = start_etcd(workdir / "etcd")
    one = _broker(tree, workdir, 1, etcd.url, "WARNING")
    two = _broker(tree, workdir, 2, etcd.url, "WARNING")
    try:
        yield one, two
    finally:
        for b in (two, one):
            b.stop()
        etcd.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def figures(rows: list[tuple[int, float]]) -> dict[str, float]:
    """The longest delivery, the 99th percentile (ms) and the partitions with a delivery
    over ``SLOW_MS``, of (partition, delivery ms) rows."""
    ms = sorted(m for _, m in rows)
    slow = {p for p, m in rows if m > SLOW_MS}
    return {"max": percentile(ms, 1.0), "p99": percentile(ms, 0.99),
            "slow": float(len(slow)), "records": float(len(ms))}  # fmt: skip


def _led_by(bootstrap: str, node: int) -> int:
    """How many partitions of the topic broker ``node`` leads, as Metadata says."""
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(TOPIC, 30)
    return sum(1 for p in md.topics[TOPIC].partitions.values() if p.leader == node)


def run_tree(
    tree: Path | None, partitions: int, topics: int, settle: float = SETTLE_S
) -> dict[str, dict[str, float]]:
    with _cluster(tree) as (one, two):
        one.start()
        create_topics(one.bootstrap, [TOPIC], partitions)
        if topics > 1:
            create_topics(one.bootstrap, [f"idle-{i}" for i in range(topics - 1)], 1)
        out, stop = Deliveries(), threading.Event()
        producer = threading.Thread(
            target=_produce, args=(one.bootstrap, partitions, out, stop), daemon=True
        )
        producer.start()
        time.sleep(settle)  # a bench phase, not a test wait
        joined = time.monotonic()
        two.start()
        time.sleep(settle)
        moved = _led_by(one.bootstrap, 2)
        left = time.monotonic()
        assert two.proc is not None
        two.proc.send_signal(signal.SIGTERM)
        two.proc.wait(120)
        time.sleep(settle)
        stop.set()
        producer.join(180)
        if out.failed:
            raise RuntimeError(f"{out.failed} records failed")
        return {
            "join": {**figures(out.between(joined, left)), "moved": float(moved)},
            "leave": figures(out.between(left, time.monotonic())),
        }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.membership", description=__doc__)
    p.add_argument("--partitions", type=int, default=24)
    p.add_argument("--topics", type=int, default=1, help="topics in all (idle ones added)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--base-tree", type=Path, help="another source tree, measured alongside")
    p.add_argument("--settle-s", type=float, default=SETTLE_S, help="seconds per phase")
    args = p.parse_args(argv)
    trees: list[tuple[str, Path | None]] = [("this tree", None)]
    if args.base_tree is not None:
        trees.append(("base", args.base_tree))
    for rnd in range(1, args.rounds + 1):
        for name, tree in trees:
            r = run_tree(tree, args.partitions, args.topics, args.settle_s)
            line = "  ".join(
                f"{event} max {f['max']:7.1f} ms p99 {f['p99']:6.1f} ms"
                f" slow {int(f['slow']):3}/{args.partitions}"
                for event, f in r.items()
            )
            moved = int(r["join"]["moved"])
            print(f"round {rnd} {name:9}: {line}  moved {moved}/{args.partitions}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
