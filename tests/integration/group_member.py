"""One consumer-group member in its own process, for the group integration tests.

    python -m tests.integration.group_member CLIENT BOOTSTRAP TOPIC GROUP OUT
        [--assignor NAME] [--instance-id ID] [--session-ms N]

CLIENT is ``confluent``, ``kafka-python`` or ``aiokafka``. For every record it appends
``R <partition> <offset>`` to OUT and then commits offset+1 synchronously; rebalance
callbacks append ``A <partitions>`` / ``V <partitions>`` (assigned / revoked). SIGTERM
closes the consumer cleanly (LeaveGroup) and exits 0; the tests SIGKILL it to simulate a
crash. Every line is flushed at once so the test can follow progress.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

HEARTBEAT_MS = 500


class Out:
    def __init__(self, path: str) -> None:
        self._f: TextIO = open(path, "a", buffering=1)  # noqa: SIM115 - lives with the process

    def line(self, text: str) -> None:
        self._f.write(text + "\n")
        self._f.flush()

    def parts(self, kind: str, partitions: list[int]) -> None:
        self.line(f"{kind} {','.join(str(p) for p in sorted(partitions))}")


def run_confluent(a: argparse.Namespace, out: Out, stop: threading.Event) -> None:
    from confluent_kafka import Consumer, TopicPartition

    conf: dict[str, Any] = {
        "bootstrap.servers": a.bootstrap,
        "group.id": a.group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": a.session_ms,
        "heartbeat.interval.ms": HEARTBEAT_MS,
        "client.id": "member-confluent",
    }
    if a.assignor:
        conf["partition.assignment.strategy"] = a.assignor
    if a.instance_id:
        conf["group.instance.id"] = a.instance_id
    c = Consumer(conf)

    def on_assign(consumer: Any, parts: list[Any]) -> None:
        out.parts("A", [p.partition for p in parts])

    def on_revoke(consumer: Any, parts: list[Any]) -> None:
        out.parts("V", [p.partition for p in parts])

    c.subscribe([a.topic], on_assign=on_assign, on_revoke=on_revoke)
    while not stop.is_set():
        msg = c.poll(0.2)
        if msg is None or msg.error():
            continue
        partition, offset = msg.partition(), msg.offset()
        assert partition is not None and offset is not None
        out.line(f"R {partition} {offset}")
        c.commit(offsets=[TopicPartition(a.topic, partition, offset + 1)], asynchronous=False)
    c.close()


def run_kafka_python(a: argparse.Namespace, out: Out, stop: threading.Event) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka import ConsumerRebalanceListener, KafkaConsumer
        from kafka.structs import OffsetAndMetadata

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked: Any) -> None:
            out.parts("V", [tp.partition for tp in revoked])

        def on_partitions_assigned(self, assigned: Any) -> None:
            out.parts("A", [tp.partition for tp in assigned])

    c = KafkaConsumer(
        bootstrap_servers=a.bootstrap,
        group_id=a.group,
        client_id="member-kafka-python",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=a.session_ms,
        heartbeat_interval_ms=HEARTBEAT_MS,
        group_instance_id=a.instance_id,
    )
    c.subscribe([a.topic], listener=Listener())
    while not stop.is_set():
        for tp, records in c.poll(timeout_ms=200).items():
            for r in records:
                out.line(f"R {r.partition} {r.offset}")
                c.commit({tp: OffsetAndMetadata(r.offset + 1, "", -1)})
    c.close()


async def run_aiokafka(a: argparse.Namespace, out: Out, stop: threading.Event) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.abc import ConsumerRebalanceListener

    class Listener(ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked: Any) -> None:
            out.parts("V", [tp.partition for tp in revoked])

        async def on_partitions_assigned(self, assigned: Any) -> None:
            out.parts("A", [tp.partition for tp in assigned])

    c = AIOKafkaConsumer(
        bootstrap_servers=a.bootstrap,
        group_id=a.group,
        client_id="member-aiokafka",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=a.session_ms,
        heartbeat_interval_ms=HEARTBEAT_MS,
    )
    await c.start()
    c.subscribe([a.topic], listener=Listener())
    try:
        while not stop.is_set():
            batches = await c.getmany(timeout_ms=200)
            for tp, records in batches.items():
                for r in records:
                    out.line(f"R {r.partition} {r.offset}")
                    await c.commit({tp: r.offset + 1})
    finally:
        await c.stop()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("client", choices=["confluent", "kafka-python", "aiokafka"])
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("group")
    p.add_argument("out")
    p.add_argument("--assignor", default=None)
    p.add_argument("--instance-id", default=None)
    p.add_argument("--session-ms", type=int, default=6000)
    a = p.parse_args(argv)
    out = Out(a.out)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    out.line("S started")
    if a.client == "confluent":
        run_confluent(a, out, stop)
    elif a.client == "kafka-python":
        run_kafka_python(a, out, stop)
    else:
        asyncio.run(run_aiokafka(a, out, stop))
    out.line("E closed")
    return 0


# ---- harness used by the tests (runs in the pytest process) ----


@dataclass
class MemberProc:
    name: str
    client: str
    out: Path
    proc: subprocess.Popen[bytes]

    def lines(self) -> list[str]:
        return self.out.read_text().splitlines() if self.out.exists() else []

    def records(self) -> list[tuple[int, int]]:
        return [(int(x[1]), int(x[2])) for x in (ln.split() for ln in self.lines()) if x[0] == "R"]

    def events(self) -> list[tuple[str, set[int]]]:
        out = []
        for ln in self.lines():
            kind, _, rest = ln.partition(" ")
            if kind in ("A", "V"):
                out.append((kind, {int(p) for p in rest.split(",") if p}))
        return out

    def assigned(self) -> set[int]:
        """Partitions held now, from the assign/revoke events."""
        held: set[int] = set()
        for kind, parts in self.events():
            held = held | parts if kind == "A" else held - parts
        return held

    def kill9(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def start_member(
    client: str, bootstrap: str, topic: str, group: str, workdir: Path, name: str, *opts: str
) -> MemberProc:
    out = workdir / f"{name}.out"
    log = open(workdir / f"{name}.log", "wb")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.group_member",
            client,
            bootstrap,
            topic,
            group,
            str(out),
            *opts,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=Path(__file__).resolve().parents[2],
    )
    log.close()
    return MemberProc(name, client, out, proc)


def wait_until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # test harness: bounded polling of the members' output files
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        fut.result(30)


def produce(bootstrap: str, topic: str, partitions: int, n: int, tag: str = "") -> None:
    from confluent_kafka import Producer

    prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(n):
        prod.produce(topic, f"{tag}{i}".encode(), partition=i % partitions)
    assert prod.flush(30) == 0


def committed(bootstrap: str, group: str) -> dict[int, int]:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        got = admin.list_group_offsets(group)[group]
        return {tp.partition: om.offset for tp, om in got.items()}
    finally:
        admin.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
