"""Consumer-group benchmark: time to Stable, and offset commits per second.

Run ``python -m bench.groups [--sizes 1,10,50] [--seconds 5] [--connections 4]`` from the
repository root. For each metadata backend (embedded, and etcd started on loopback) it
starts a real broker process and measures:

- **time to Stable**: N confluent-kafka consumers (one process, librdkafka threads) join
  one group on a topic of max(N) partitions at once; the time from the first ``subscribe``
  until every consumer holds its partitions and DescribeGroups reports ``Stable``.
  Clients use ``heartbeat.interval.ms`` = ``--heartbeat-ms`` (default 1000): a rebalance
  started after a member's join is noticed by the others on their next heartbeat.
- **offset commits/s**: ``--connections`` raw TCP connections, each sending OffsetCommit v8
  requests back to back (one request in flight per connection, a standalone group per
  connection) for ``--seconds``; with 1 and with 10 partitions per request. Every commit
  is one metadata-store transaction.

Prints figures; it is not a test and asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from tests.fixtures.broker import BrokerProcess, start_broker
from tests.fixtures.etcd import start_etcd


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        fut.result(30)


def _group_state(bootstrap: str, group: str) -> str:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    desc = admin.describe_consumer_groups([group])[group].result(30)
    return str(desc.state.name)


def time_to_stable(bootstrap: str, topic: str, partitions: int, n: int, hb_ms: int) -> float:
    from confluent_kafka import Consumer

    group = f"stable-{n}-{uuid.uuid4().hex[:6]}"
    held: dict[int, set[int]] = {i: set() for i in range(n)}
    consumers = []

    def tracker(i: int) -> tuple[Any, Any]:
        def on_assign(_c: Any, parts: list[Any]) -> None:
            held[i] = {p.partition for p in parts}

        def on_revoke(_c: Any, parts: list[Any]) -> None:
            held[i] = set()

        return on_assign, on_revoke

    t0 = time.monotonic()
    for i in range(n):
        c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "session.timeout.ms": 10000,
                "heartbeat.interval.ms": hb_ms,
                "enable.auto.commit": False,
            }
        )
        on_assign, on_revoke = tracker(i)
        c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
        consumers.append(c)
    deadline = t0 + 120
    try:
        while time.monotonic() < deadline:  # benchmark driver: poll every client in turn
            for c in consumers:
                c.poll(0)
            covered = sorted(p for s in held.values() for p in s)
            if covered == list(range(partitions)) and all(held.values()):
                if _group_state(bootstrap, group) == "STABLE":
                    return time.monotonic() - t0
            time.sleep(0.01)
        raise RuntimeError(f"group of {n} did not become Stable in 120 s")
    finally:
        for c in consumers:
            c.close()


def _commit_request(group: str, topic: str, partitions: int) -> bytes:
    from kafka.protocol.consumer import OffsetCommitRequest

    t = OffsetCommitRequest.OffsetCommitRequestTopic
    p = t.OffsetCommitRequestPartition
    req = OffsetCommitRequest(
        group_id=group,
        generation_id_or_member_epoch=-1,
        member_id="",
        group_instance_id=None,
        topics=[
            t(
                name=topic,
                partitions=[
                    p(
                        partition_index=i,
                        committed_offset=42,
                        committed_leader_epoch=-1,
                        committed_metadata="",
                    )
                    for i in range(partitions)
                ],
            )
        ],
    )
    req.with_header(correlation_id=1, client_id="bench")
    return bytes(req.encode(version=8, header=True, framed=True))


async def _committer(port: int, frame: bytes, stop_at: float) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    n, last = 0, b""
    try:
        while time.monotonic() < stop_at:
            writer.write(frame)
            await writer.drain()
            (size,) = struct.unpack(">i", await reader.readexactly(4))
            last = await reader.readexactly(size)
            n += 1
    finally:
        writer.close()
        await writer.wait_closed()
    return n, last


def commits_per_second(port: int, topic: str, conns: int, parts: int, seconds: float) -> float:
    from kafka.protocol.consumer import OffsetCommitResponse

    frames = [_commit_request(f"bench-{uuid.uuid4().hex[:6]}", topic, parts) for _ in range(conns)]

    async def run() -> list[tuple[int, bytes]]:
        stop_at = time.monotonic() + seconds
        return await asyncio.gather(*(_committer(port, f, stop_at) for f in frames))

    t0 = time.monotonic()
    results = asyncio.run(run())
    elapsed = time.monotonic() - t0
    for _, last in results:
        resp = OffsetCommitResponse.decode(last, version=8, header=True)
        codes = {p.error_code for t in resp.topics for p in t.partitions}
        if codes != {0}:
            raise RuntimeError(f"commits failed with error codes {codes}")
    return sum(n for n, _ in results) / elapsed


def bench_backend(
    name: str, broker: BrokerProcess, sizes: list[int], args: argparse.Namespace
) -> list[str]:
    lines = []
    partitions = max(*sizes, 10)  # the commit runs use 10 partitions
    topic = f"bench-groups-{uuid.uuid4().hex[:6]}"
    _create_topic(broker.bootstrap, topic, partitions)
    for n in sizes:
        secs = time_to_stable(broker.bootstrap, topic, partitions, n, args.heartbeat_ms)
        lines.append(f"{name:9} time to Stable, {n:3d} members      {secs:8.2f} s")
        print(lines[-1], flush=True)
    for parts in (1, 10):
        rate = commits_per_second(broker.port, topic, args.connections, parts, args.seconds)
        lines.append(
            f"{name:9} OffsetCommit, {parts:2d} partition(s)/req  {rate:8.0f} req/s "
            f"({rate * parts:.0f} offsets/s, {args.connections} connections)"
        )
        print(lines[-1], flush=True)
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.groups", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1,10,50", help="group sizes (default 1,10,50)")
    p.add_argument("--seconds", type=float, default=5.0, help="duration of each commit run")
    p.add_argument("--connections", type=int, default=4, help="committing connections")
    p.add_argument("--heartbeat-ms", type=int, default=1000, help="clients' heartbeat interval")
    p.add_argument("--backends", default="embedded,etcd", help="embedded,etcd")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    summary: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-groups-") as tmp:
        work = Path(tmp)
        for backend in args.backends.split(","):
            (work / "etcd").mkdir(exist_ok=True)
            etcd = start_etcd(work / "etcd") if backend == "etcd" else None
            try:
                meta = etcd.url if etcd is not None else None
                broker = start_broker(work / f"broker-{backend}", meta_url=meta)
                try:
                    summary += bench_backend(backend, broker, sizes, args)
                finally:
                    broker.stop()
            finally:
                if etcd is not None:
                    etcd.stop()
    print("\nsummary\n" + "\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
