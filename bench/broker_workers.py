"""The load workers of ``bench.broker``: one producer or consumer per process.

``python -m bench.broker worker SPEC`` runs ``worker_main(SPEC)`` (``SPEC`` is JSON): a
producer (``kind`` produce: full speed, or paced at ``rate`` msg/s), a consumer (``kind``
consume; ``rewind`` re-reads the mock's retained window) or the host of librdkafka's mock
cluster (``kind`` mock: prints its bootstrap, creates the topics asked for on stdin, lives
until stdin closes). Produce and consume print one JSON line of results, which
``run_worker`` returns to the orchestrator. Each runs in its own process so clients never
share a GIL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any

from bench.stats import percentile

WORKER_TIMEOUT = 300.0


#: the longest sleep between two polls of a paced producer: a delivery report waits at
#: most this long to be seen (``Message.latency`` is taken when the callback runs)
PACE_SLICE_S = 0.0002


def pace(producer: Any, until: float) -> None:
    """Serve delivery reports until ``until`` (``time.perf_counter``). ``poll`` waits
    whole milliseconds: a shorter timeout returns at once, so pacing 2,000 msg/s with
    ``poll(wait)`` alone spun a core of the machine the broker shares (docs/benchmarks.md,
    "Round 26"). A wait under a millisecond is slept in slices of ``PACE_SLICE_S``, with
    a ``poll(0)`` after each, so a report's latency is read within a slice of its
    arrival."""
    while (wait := until - time.perf_counter()) > 0:
        if wait >= 0.001:
            producer.poll(wait)
        else:
            time.sleep(min(wait, PACE_SLICE_S))
            producer.poll(0)


def _produce(spec: dict[str, Any]) -> dict[str, Any]:
    from confluent_kafka import Producer

    latencies: list[float] = []
    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            latencies.append(msg.latency() or 0.0)

    producer = Producer(
        {
            "bootstrap.servers": spec["bootstrap"],
            "acks": "all",
            "enable.idempotence": bool(spec["idempotence"]),
            "linger.ms": 5,
            "message.timeout.ms": int(WORKER_TIMEOUT * 1000),
            "log_level": 3,
            "compression.type": spec.get("compression", "none"),
        }
    )
    topic, count, rate = spec["topic"], int(spec["messages"]), float(spec.get("rate", 0))
    partitions = int(spec["partitions"])
    size = int(spec["size"])
    payload = os.urandom(size)
    if spec.get("compression", "none") != "none":  # half random: compressible ~2:1
        payload = payload[: size // 2] + bytes(size - size // 2)
    producer.produce(topic, payload, partition=0)  # connect (and get a producer id) first
    producer.flush(30)
    latencies.clear()
    start = time.perf_counter()
    cpu0 = time.process_time()  # the producer's own CPU (all its threads: librdkafka's too)
    for i in range(count):
        if rate:
            pace(producer, start + i / rate)
        while True:
            try:
                producer.produce(topic, payload, partition=i % partitions, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.005)
        if not i & 255:
            producer.poll(0)
    unsent = producer.flush(WORKER_TIMEOUT)
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    latencies.sort()
    return {
        "messages": len(latencies),
        "bytes": len(latencies) * len(payload),
        "seconds": elapsed,
        "errors": len(errors) + unsent,
        "cpu_seconds": cpu,
        "first_error": errors[0] if errors else None,
        "p50_ms": percentile(latencies, 0.50) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
    }


def _window(consumer: Any, topic: str, partitions: int) -> int:
    """(Re-)assign every partition at its log start; the messages up to the log end."""
    from confluent_kafka import TopicPartition

    tps, total = [], 0
    for p in range(partitions):
        lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
        tps.append(TopicPartition(topic, p, lo))
        total += hi - lo
    consumer.assign(tps)
    return total


def _consume(spec: dict[str, Any]) -> dict[str, Any]:
    """Read ``messages`` from the beginning. With ``rewind`` (the mock, which keeps only
    ~5 MB per partition) the retained window is read again and again until then."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": spec["bootstrap"],
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "log_level": 3,
            # rewinding: the watermark query waits behind an idle long poll at the log end
            **({"fetch.wait.max.ms": 5} if spec.get("rewind") else {}),
            # bytes per partition per fetch (librdkafka's default: 1 MiB)
            **(
                {"max.partition.fetch.bytes": spec["fetch_bytes"]}
                if spec.get("fetch_bytes")
                else {}
            ),
        }
    )
    topic, count, rewind = spec["topic"], int(spec["messages"]), bool(spec.get("rewind"))
    partitions = int(spec["partitions"])
    got = nbytes = errors = rewinds = 0
    window = _window(consumer, topic, partitions)
    start = time.perf_counter()
    cpu0 = time.process_time()  # the consumer's own CPU (all its threads)
    deadline = start + WORKER_TIMEOUT
    first_at, first_n, first_b = 0.0, 0, 0
    while got < count and time.perf_counter() < deadline:
        if rewind and window <= 0:
            window, rewinds = _window(consumer, topic, partitions), rewinds + 1
        # ask for no more than is there: consume() waits out its timeout when short
        for m in consumer.consume(min(10_000, count - got, window if rewind else count), 1.0):
            if m.error() is not None:
                errors += 1
                continue
            got += 1
            window -= 1
            nbytes += len(m.value() or b"")
        if got and not first_at:  # steady state is timed from the first batch on
            first_at, first_n, first_b = time.perf_counter(), got, nbytes
    end = time.perf_counter()
    cpu = time.process_time() - cpu0
    consumer.close()
    return {
        "messages": got,
        "bytes": nbytes,
        "seconds": end - start,
        "steady_messages": got - first_n,
        "steady_bytes": nbytes - first_b,
        "steady_seconds": end - first_at if first_at else 0.0,
        "errors": errors,
        "cpu_seconds": cpu,
        "rewinds": rewinds,
    }


def _host_mock(rtt_ms: int = 0) -> None:
    """Hold a librdkafka mock cluster (``rtt_ms``: its simulated round trip, which delays
    every response); print its bootstrap; then, for each line ``{"topic": NAME,
    "partitions": N}`` read from stdin, create that topic and print ``{"error": null}``
    (or the reason); live until stdin closes."""
    from bench.mock_cluster import MockCluster

    cluster = MockCluster(rtt_ms)
    try:
        print(json.dumps({"bootstrap": cluster.bootstrap}), flush=True)
        for line in sys.stdin:
            ask = json.loads(line)
            try:
                cluster.create_topic(ask["topic"], int(ask["partitions"]))
                reply = None
            except RuntimeError as exc:
                reply = str(exc)
            print(json.dumps({"error": reply}), flush=True)
    finally:
        cluster.close()


def worker_main(spec: dict[str, Any]) -> int:
    kind = spec["kind"]
    if spec.get("nice"):
        os.nice(int(spec["nice"]))
    if kind == "mock":
        _host_mock(int(spec.get("rtt_ms", 0)))
        return 0
    result = _produce(spec) if kind == "produce" else _consume(spec)
    print(json.dumps(result), flush=True)
    return 0


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.broker", "worker", json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=WORKER_TIMEOUT + 60)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {spec['kind']} failed:\n{proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result
