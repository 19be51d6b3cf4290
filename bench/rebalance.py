"""Rebalance time of consumer groups: classic (JoinGroup/SyncGroup) against KIP-848.

Run ``python -m bench.rebalance [--quick] [--members 10,50]`` from the repository root.

For each group size N and protocol, one broker (local store, embedded metadata) serves a
topic of 2N partitions that a producer thread keeps writing to (one record per partition
every ``--interval-ms``, the value being its produce time). N-1 confluent-kafka members
share it until every partition is being consumed; then member N joins at T0. Reported:

- ``resume_s``: from T0 until the new member consumes and every partition has delivered
  a record after that moment (the issue's "time from a member joining to every partition
  being consumed again");
- ``max_gap_s``: the longest any partition went without delivering a record after T0;
- ``paused``: partitions that went more than 1 s without delivering (a stop-the-world
  rebalance pauses every partition, an incremental one only those that move).

Heartbeat intervals are each protocol's default (classic: librdkafka's 3 s, sessions of
45 s; KIP-848: the broker's ``--group-consumer-heartbeat-interval-ms``, Kafka's 5 s)
unless ``--heartbeat-ms`` sets both. Classic members use librdkafka's default assignors
(``range,roundrobin``: eager). The first N-1 members start spread over one heartbeat
interval (as independent processes would). All members are polled round-robin by one
thread. One trial is noisy: a rebalance waits on heartbeats, whose phase is random.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from tests.fixtures.broker import BrokerProcess, start_broker

PAUSE_S = 1.0


def _producer(bootstrap: str, topic: str, partitions: int, interval: float, stop: Any) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    while not stop.is_set():
        now = repr(time.time()).encode()
        for part in range(partitions):
            p.produce(topic, now, partition=part)
        p.poll(0)
        stop.wait(interval)
    p.flush(10)


def _member(bootstrap: str, group: str, topic: str, protocol: str, hb_ms: int | None) -> Any:
    from confluent_kafka import Consumer

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "group.protocol": protocol,
        "auto.offset.reset": "latest",
        "enable.auto.commit": True,
        "fetch.wait.max.ms": 100,
    }
    if protocol == "classic":
        conf["session.timeout.ms"] = 45_000
        if hb_ms:
            conf["heartbeat.interval.ms"] = hb_ms
    c = Consumer(conf)
    c.subscribe([topic])
    return c


def _poll_all(members: list[Any], on_record: Any) -> None:
    """One round over every member: ``on_record(member index, partition, produce time)``."""
    for i, c in enumerate(members):
        for m in c.consume(num_messages=500, timeout=0):
            if m.error() is None:
                on_record(i, m.partition(), float(m.value()))


def _settle(members: list[Any], partitions: int) -> None:
    """Poll until every partition delivers within one 1.5 s window (the group is settled)."""
    deadline = time.time() + 180
    seen: set[int] = set()

    def on_record(i: int, part: int, produced: float) -> None:
        seen.add(part)

    while time.time() < deadline:
        seen.clear()
        window = time.time() + 1.5
        while time.time() < window and len(seen) < partitions:
            _poll_all(members, on_record)
            time.sleep(0.005)
        if len(seen) == partitions:
            return
    raise RuntimeError("the first members never covered the topic")


def _measure_join(
    group_members: list[Any], partitions: int, t0: float
) -> tuple[float, dict[int, float]]:
    """Poll after the last member joined at ``t0``: (seconds until it consumes and every
    partition delivered after that, longest gap per partition)."""
    newcomer = len(group_members) - 1
    last = dict.fromkeys(range(partitions), t0)
    gap = dict.fromkeys(range(partitions), 0.0)
    first_new: list[float] = []

    def on_record(i: int, part: int, produced: float) -> None:
        now = time.time()
        gap[part] = max(gap[part], now - last[part])
        last[part] = now
        if i == newcomer and not first_new:
            first_new.append(now)

    while time.time() < t0 + 180:
        _poll_all(group_members, on_record)
        if first_new and all(v > first_new[0] for v in last.values()):
            return time.time() - t0, gap
        time.sleep(0.002)
    raise RuntimeError("no full resume within 180 s")


def _close_all(members: list[Any]) -> None:
    """Close every member at once (one after the other, the classic ones left waiting
    would sit through a rebalance per departure)."""
    threads = [threading.Thread(target=c.close, daemon=True) for c in members]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)


def run_once(
    broker: BrokerProcess, members: int, protocol: str, interval: float, hb_ms: int | None
) -> dict[str, Any]:
    from confluent_kafka.admin import AdminClient, NewTopic

    topic, group = f"rebalance-{uuid.uuid4().hex[:8]}", f"bench-{uuid.uuid4().hex[:8]}"
    partitions = 2 * members
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for fut in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        fut.result(30)
    stop = threading.Event()
    prod = threading.Thread(
        target=_producer, args=(broker.bootstrap, topic, partitions, interval, stop), daemon=True
    )
    prod.start()
    group_members: list[Any] = []
    try:
        # members start spread over one heartbeat interval, as independent processes
        # would (members started in a burst heartbeat in lockstep and all learn of a
        # rebalance at once, which flatters the classic protocol)
        spread = (hb_ms or (3000 if protocol == "classic" else 5000)) / 1000 / (members - 1)
        for _ in range(members - 1):
            group_members.append(_member(broker.bootstrap, group, topic, protocol, hb_ms))
            until = time.time() + spread
            while time.time() < until:
                _poll_all(group_members, lambda i, part, produced: None)
                time.sleep(0.005)
        _settle(group_members, partitions)
        t0 = time.time()
        group_members.append(_member(broker.bootstrap, group, topic, protocol, hb_ms))
        resume, gap = _measure_join(group_members, partitions, t0)
        return {
            "members": members,
            "protocol": protocol,
            "partitions": partitions,
            "resume_s": resume,
            "max_gap_s": max(gap.values()),
            "paused": sum(1 for g in gap.values() if g > PAUSE_S),
        }
    finally:
        stop.set()
        prod.join(30)
        _close_all(group_members)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.rebalance", description=__doc__.split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="one trial per size and protocol")
    p.add_argument("--members", default="10,50", help="group sizes (default 10,50)")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--interval-ms", type=int, default=200, help="per-partition produce period")
    p.add_argument("--heartbeat-ms", type=int, default=0, help="both protocols' heartbeat")
    args = p.parse_args(argv)
    trials = 1 if args.quick else args.trials
    hb = args.heartbeat_ms or None
    extra = ["--group-consumer-heartbeat-interval-ms", str(hb)] if hb else []
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-rebalance-") as tmp:
        broker = start_broker(Path(tmp), extra_args=tuple(extra))
        try:
            for n in (int(x) for x in args.members.split(",")):
                for protocol in ("classic", "consumer"):
                    results = [
                        run_once(broker, n, protocol, args.interval_ms / 1000, hb)
                        for _ in range(trials)
                    ]
                    best = sorted(results, key=lambda r: r["resume_s"])[len(results) // 2]
                    rows.append(best)
                    print(
                        f"members={n:3d} protocol={protocol:8s} partitions={best['partitions']:3d} "
                        f"resume_s={best['resume_s']:6.2f} max_gap_s={best['max_gap_s']:6.2f} "
                        f"paused={best['paused']}/{best['partitions']}",
                        flush=True,
                    )
        finally:
            broker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
