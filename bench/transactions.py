"""Transactional produce benchmark (issue 9): throughput with transactions of 100 and of
10,000 records against a non-transactional (idempotent) producer, and the commit latency
(``commit_transaction`` round trip: EndTxn, markers written on every partition) p50/p99.

Run ``python -m bench.transactions [--records N] [--partitions P] [--targets local,s3]
[--quick]`` from the repository root. Each target starts a real broker process
(``local``: local-directory store + embedded metadata; ``s3``: SeaweedFS + embedded
metadata) and one confluent-kafka producer with 100-byte values, acks=all, warmed up
(connected, one record per partition, in a transaction for the transactional modes)
before the clock starts. Prints
figures; it is not a test and asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.fs_probe import bench_dir
from bench.stats import percentile
from tests.fixtures.broker import BrokerProcess, start_broker

VALUE = b"x" * 100


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        fut.result(30)


def run_mode(bootstrap: str, partitions: int, records: int, txn_size: int) -> dict[str, Any]:
    """Produce ``records`` records; ``txn_size`` 0 = idempotent, no transactions."""
    from confluent_kafka import Producer

    topic = f"bench-txn-{txn_size}-{uuid.uuid4().hex[:6]}"
    _create_topic(bootstrap, topic, partitions)
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "linger.ms": 5,
        "enable.idempotence": True,
        "queue.buffering.max.messages": 1_000_000,
    }
    if txn_size:
        conf["transactional.id"] = f"bench-{uuid.uuid4().hex[:8]}"
    p = Producer(conf)
    commits: list[float] = []
    if txn_size:  # warm-up (untimed): connections, producer id, partition leaders
        p.init_transactions(30)
        p.begin_transaction()
    for part in range(partitions):
        p.produce(topic, b"warm-up", partition=part)
    if txn_size:
        p.commit_transaction(60)
    p.flush(60)
    t0 = time.monotonic()
    sent = 0
    while sent < records:
        n = min(txn_size or records, records - sent)
        if txn_size:
            p.begin_transaction()
        for i in range(n):
            while True:
                try:
                    p.produce(topic, VALUE, partition=(sent + i) % partitions)
                    break
                except BufferError:
                    p.poll(0.01)
        if txn_size:
            c0 = time.monotonic()
            p.commit_transaction(60)  # flushes, then EndTxn
            commits.append((time.monotonic() - c0) * 1000)
        sent += n
    p.flush(60)
    secs = time.monotonic() - t0
    return {
        "records/s": records / secs,
        "MB/s": records * len(VALUE) / secs / 1e6,
        "commits": len(commits),
        "commit p50 ms": statistics.median(commits) if commits else float("nan"),
        "commit p99 ms": percentile(sorted(commits), 0.99),
    }


@contextlib.contextmanager
def _broker(target: str, tmp: Path) -> Iterator[BrokerProcess]:
    with contextlib.ExitStack() as stack:
        kwargs: dict[str, Any] = {}
        if target == "s3":
            from tests.fixtures.s3 import create_bucket, run_seaweedfs

            endpoint = stack.enter_context(run_seaweedfs())
            kwargs["store_url"] = endpoint.store_url(create_bucket(endpoint), "kafscale")
        b = start_broker(tmp / target, **kwargs)
        stack.callback(b.stop)
        yield b


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.transactions")
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--targets", default="local,s3")
    ap.add_argument("--quick", action="store_true", help="20,000 records")
    args = ap.parse_args(argv)
    records = 20_000 if args.quick else args.records
    modes = [("non-transactional", 0), ("txn of 100", 100), ("txn of 10,000", 10_000)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-txn-", dir=bench_dir()) as tmpdir:
        for target in args.targets.split(","):
            with _broker(target, Path(tmpdir)) as b:
                for name, size in modes:
                    res = run_mode(b.bootstrap, args.partitions, records, size)
                    rows.append((target, name, res))
                    print(f"{target:6} {name:18} {res}", file=sys.stderr)
    print(f"{records} records of {len(VALUE)} B, {args.partitions} partitions, acks=all")
    head = ("target", "mode", "rec/s", "MB/s", "commits", "p50 ms", "p99 ms")
    print("{:7} {:18} {:>9} {:>6} {:>8} {:>7} {:>7}".format(*head))
    for target, name, r in rows:
        print(
            f"{target:7} {name:18} {r['records/s']:>9,.0f} {r['MB/s']:>6.2f} {r['commits']:>8} "
            f"{r['commit p50 ms']:>7.1f} {r['commit p99 ms']:>7.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
