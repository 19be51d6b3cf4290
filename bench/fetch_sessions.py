"""Fetch at 1000 partitions with and without KIP-227 fetch sessions (issue 12).

Two brokers on local-directory stores: one with sessions (the default), one started with
``--max-fetch-sessions 0`` (every fetch is full). Each gets a 1000-partition topic filled
by confluent-kafka, then kafka-python's consumer (which uses fetch sessions, as the Java
client does) reads it all through a counting proxy (``tests/fixtures/byte_proxy.py``) with
``fetch_max_bytes`` 1 MiB, so the read takes many fetch rounds, and keeps polling an idle
topic for a few seconds. Printed per mode: broker CPU seconds per MB consumed, broker CPU
per second while idle, and Fetch request/response bytes in each phase.

Run: ``.venv/bin/python -m bench.fetch_sessions [--quick]``. Not a test: asserts nothing.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, TopicPartition

from bench.broker_targets import cpu_seconds
from protocol.apis import ApiKey
from tests.fixtures.broker import BrokerProcess, free_port, start_broker
from tests.fixtures.byte_proxy import ApiBytes, ByteProxy

PARTITIONS = 1000
VALUE = b"v" * 1024
MB = 1e6


def _fill(bootstrap: str, megabytes: int) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("wide", num_partitions=PARTITIONS)])["wide"].result(60)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 65536})
    count = megabytes * 1000
    for i in range(count):
        while True:
            try:
                p.produce("wide", value=VALUE, partition=i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(120) == 0
    return count


def _delta(a: ApiBytes, b: ApiBytes) -> ApiBytes:
    return ApiBytes(
        b.requests - a.requests,
        b.request_bytes - a.request_bytes,
        b.responses - a.responses,
        b.response_bytes - a.response_bytes,
    )


def _measure(broker: BrokerProcess, proxy: ByteProxy, count: int, idle_s: float) -> dict[str, Any]:
    c = KafkaConsumer(
        bootstrap_servers=f"127.0.0.1:{proxy.port}",
        enable_auto_commit=False,
        fetch_max_bytes=1 << 20,
        fetch_max_wait_ms=100,
        request_timeout_ms=60000,
    )
    try:
        c.assign([TopicPartition("wide", p) for p in range(PARTITIONS)])
        c.seek_to_beginning()
        c.poll(timeout_ms=0)
        f0, cpu0, t0 = proxy.counts.snapshot(ApiKey.FETCH), cpu_seconds(broker.pid), time.time()
        got = nbytes = 0
        while got < count:
            for records in c.poll(timeout_ms=500).values():
                got += len(records)
                nbytes += sum(len(r.value) for r in records)
        f1, cpu1, t1 = proxy.counts.snapshot(ApiKey.FETCH), cpu_seconds(broker.pid), time.time()
        end = time.time() + idle_s
        while time.time() < end:
            c.poll(timeout_ms=100)
        f2, cpu2, t2 = proxy.counts.snapshot(ApiKey.FETCH), cpu_seconds(broker.pid), time.time()
    finally:
        c.close()
    return {
        "mb": nbytes / MB,
        "consume_s": t1 - t0,
        "cpu_per_mb": (cpu1 - cpu0) / (nbytes / MB),
        "consume_fetch": _delta(f0, f1),
        "idle_cpu_per_s": (cpu2 - cpu1) / (t2 - t1),
        "idle_fetch": _delta(f1, f2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="8 MB and 5 s idle (default 40, 15)")
    args = ap.parse_args()
    megabytes, idle_s = (8, 5.0) if args.quick else (40, 15.0)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode, extra in (("sessions", ()), ("sessionless", ("--max-fetch-sessions", "0"))):
            listen = free_port()
            proxy = ByteProxy(listen).start()
            broker = start_broker(
                Path(tmp) / mode,
                port=listen,
                extra_args=("--advertised-listener", f"127.0.0.1:{proxy.port}", *extra),
            )
            try:
                count = _fill(f"127.0.0.1:{proxy.port}", megabytes)
                results[mode] = _measure(broker, proxy, count, idle_s)
            finally:
                broker.stop()
                proxy.stop()
    print(f"\nFetch at {PARTITIONS} partitions, kafka-python consumer, fetch_max_bytes 1 MiB")
    head = "mode         MB    s   cpu s/MB  fetches  req B/fetch  resp B/fetch | idle: cpu s/s  fetches  req B/fetch  resp B/fetch"  # noqa: E501
    print(head)
    for mode, r in results.items():
        cf, idf = r["consume_fetch"], r["idle_fetch"]
        print(
            f"{mode:<11} {r['mb']:5.1f} {r['consume_s']:5.1f} {r['cpu_per_mb']:8.4f}"
            f" {cf.requests:8d} {cf.request_bytes / max(cf.requests, 1):12.0f}"
            f" {cf.response_bytes / max(cf.responses, 1):13.0f} |"
            f" {r['idle_cpu_per_s']:13.3f} {idf.requests:8d}"
            f" {idf.request_bytes / max(idf.requests, 1):12.0f}"
            f" {idf.response_bytes / max(idf.responses, 1):13.0f}"
        )


if __name__ == "__main__":
    main()
