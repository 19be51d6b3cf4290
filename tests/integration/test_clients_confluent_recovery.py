"""confluent-kafka (librdkafka) idempotence and recovery against real broker processes.

Each test gets a broker of its own: one sits behind a proxy that loses Produce responses
after the commit; the others are killed with ``kill -9`` mid-stream and started again on
the same port and data directory (local store + embedded metadata, and SeaweedFS S3 +
etcd).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.broker import BrokerProcess, free_port, start_broker
from tests.integration.conftest import (
    BACKENDS,
    TIMEOUT,
    DroppingProxy,
    backend_kwargs,
    broker_behind_dropping_proxy,
    unique_topic,
)
from tests.integration.test_clients_confluent import (
    Ack,
    consume,
    consumer,
    drain,
    produce_acked,
    producer,
)

pytestmark = pytest.mark.integration


def test_idempotent_retries_of_lost_responses_are_deduplicated(tmp_path: Path) -> None:
    """Every 7th Produce response is lost on the way back (the connection is cut after the
    broker committed): the producer retries those batches, and each record still lands
    exactly once, at the offset its delivery report names."""
    with broker_behind_dropping_proxy(tmp_path / "b", drop_every=7) as (b, proxy, bootstrap):
        topic = unique_topic("cf-idem-retry")
        conf = {
            "enable.idempotence": True,
            "linger.ms": 2,
            "batch.num.messages": 25,
            "message.timeout.ms": 60_000,
            "reconnect.backoff.ms": 20,
        }
        n, writers = 2400, 3  # three idempotent producers at once, each its own producer id
        items = [{"key": b"%d" % (i % 5), "value": b"%d" % i} for i in range(n)]
        results: list[list[Ack]] = []

        def write(share: list[dict[str, Any]]) -> None:
            results.append(produce_acked(producer(bootstrap, **conf), topic, share))

        threads = [
            threading.Thread(target=write, args=(items[w::writers],)) for w in range(writers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        assert len(results) == writers
        acks = [a for r in results for a in r]
        assert proxy.dropped >= 3, (proxy.dropped, proxy.produce_responses)
        got = consume(bootstrap, topic, {0: 0, 1: 0}, n)
        assert sorted(int(r.value or b"") for r in got) == list(range(n))
        assert {(a.partition, a.offset, a.value) for a in acks} == {
            (r.partition, r.offset, r.value) for r in got
        }


def _produce_through_kill9(
    b: BrokerProcess, topic: str, n: int
) -> tuple[list[Ack], list[Any], int]:
    """Produce ``n`` records idempotently; kill -9 the broker midway and start it again.
    Returns the delivery reports, the errors and how many were acknowledged at the kill."""
    p = producer(
        b.bootstrap,
        **{
            "enable.idempotence": True,
            "linger.ms": 5,
            "batch.num.messages": 50,
            "message.timeout.ms": 60_000,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500,
        },
    )
    acks: list[Ack] = []
    errors: list[Any] = []
    acked_at_kill = -1

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            acks.append(Ack(msg.partition(), msg.offset(), msg.key(), msg.value()))

    for i in range(n):
        p.produce(topic, key=f"k{i % 13}".encode(), value=b"%d" % i, on_delivery=on_delivery)
        p.poll(0)
        if i == n // 2:
            deadline = time.monotonic() + TIMEOUT
            while len(acks) < n // 4 and time.monotonic() < deadline:
                p.poll(0.05)  # some acknowledged before the crash (delivery callbacks)
            assert len(acks) >= n // 4
            b.kill9()  # requests are in flight: their outcome is unknown to the producer
            acked_at_kill = len(acks)
        if i == n // 2 + n // 10:
            b.start()
        if i % 200 == 0:
            p.poll(0.01)
    assert p.flush(90) == 0
    return acks, errors, acked_at_kill


def _start(
    request: pytest.FixtureRequest, backend: str, workdir: Path, *args: str
) -> BrokerProcess:
    kwargs = backend_kwargs(request, backend)
    kwargs["extra_args"] = (*kwargs.get("extra_args", ()), *args)
    return start_broker(workdir, **kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_idempotent_producer_survives_broker_kill9(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    b = _start(request, backend, tmp_path / "b", "--default-partitions", "3", "--lease-ttl", "3")
    try:
        topic = unique_topic("cf-idem-kill")
        n = 3000
        acks, errors, acked_at_kill = _produce_through_kill9(b, topic, n)
        assert acked_at_kill < n // 2 + 1, "nothing was pending at the kill: no retry"
        assert errors == []
        assert len(acks) == n
        assert b.starts == 2
        ends = {part: 1 + max(a.offset for a in acks if a.partition == part) for part in range(3)}
        assert sum(ends.values()) == n, "gaps or duplicates in the acknowledged offsets"
        got = consume(b.bootstrap, topic, {part: 0 for part in range(3)}, n)
        assert {(a.partition, a.offset, a.key, a.value) for a in acks} == {
            (r.partition, r.offset, r.key, r.value) for r in got
        }
        # order per key (one partition per key) is the produce order
        last: dict[bytes | None, int] = {}
        for r in sorted(got, key=lambda r: (r.partition, r.offset)):
            v = int(r.value or b"")
            assert v > last.get(r.key, -1)
            last[r.key] = v
    finally:
        b.stop()


# small fetches and a short prefetch queue: the consumer is mid-log when the broker dies
LIVE_CONF = {
    "max.partition.fetch.bytes": 2000,
    "queued.min.messages": 20,
    "reconnect.backoff.ms": 50,
}


@pytest.mark.parametrize("backend", BACKENDS)
def test_restart_recovery_after_kill9(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    b = _start(request, backend, tmp_path / "b", "--default-partitions", "3", "--lease-ttl", "3")
    try:
        topic = unique_topic("cf-recover")
        p = producer(b.bootstrap, **{"acks": "all", "linger.ms": 5, "compression.type": "gzip"})
        items = [{"key": f"k{i % 7}".encode(), "value": b"%d" % i} for i in range(600)]
        acks = produce_acked(p, topic, items)
        ends = {part: 1 + max(a.offset for a in acks if a.partition == part) for part in range(3)}
        # a consumer that lives through the crash: its position and leader epoch are stale
        from confluent_kafka import TopicPartition

        live = consumer(b.bootstrap, **LIVE_CONF)
        live.assign([TopicPartition(topic, part, 0) for part in range(3)])
        before = drain(live, 200)
        b.kill9()
        b.start()
        got = consume(b.bootstrap, topic, {part: 0 for part in range(3)}, len(items))
        assert {(a.partition, a.offset, a.key, a.value) for a in acks} == {
            (r.partition, r.offset, r.key, r.value) for r in got
        }
        # a cold read (nothing cached after the restart) into the middle of a batch
        mid = ends[0] // 2 + 1
        tail = consume(b.bootstrap, topic, {0: mid}, ends[0] - mid)
        assert [r.offset for r in tail] == list(range(mid, ends[0]))
        p2 = producer(b.bootstrap, **{"acks": "all", "linger.ms": 5})
        more = produce_acked(
            p2, topic, [{"partition": part, "value": b"after"} for part in range(3)]
        )
        assert sorted((a.partition, a.offset) for a in more) == sorted(ends.items())
        after = drain(live, len(items) + 3 - len(before), 30.0)
        live.close()
        seen = sorted((r.partition, r.offset) for r in before + after)
        assert seen == [(part, o) for part in range(3) for o in range(ends[part] + 1)]
        assert "kafscale-test-secret" not in b.log_text()  # credentials never logged
    finally:
        b.stop()


@pytest.mark.parametrize("backend", BACKENDS)
def test_retry_after_restart_is_deduplicated_from_segments(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    """A batch is committed, its response lost, and the broker killed before the producer
    retries: the restarted broker knows the producer's sequences only from the segments
    (rebuilt on takeover), and must still acknowledge the retry with the original offset
    instead of appending it again."""
    proxy_port = free_port()
    b = _start(
        request,
        backend,
        tmp_path / "b",
        "--advertised-listener",
        f"127.0.0.1:{proxy_port}",
        "--default-partitions",
        "1",
        "--lease-ttl",
        "3",
    )
    proxy = DroppingProxy(proxy_port, b.port, drop_every=4, max_drops=1, hold_after_drop=True)
    proxy.start()
    try:
        topic = unique_topic("cf-idem-rebuild")
        conf = {
            "enable.idempotence": True,
            "linger.ms": 5,
            "batch.num.messages": 20,
            "message.timeout.ms": 60_000,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500,
        }
        n = 400
        items = [{"value": b"%d" % i} for i in range(n)]
        results: list[list[Ack]] = []
        writer = threading.Thread(
            target=lambda: results.append(
                produce_acked(producer(f"127.0.0.1:{proxy_port}", **conf), topic, items)
            )
        )
        writer.start()
        assert proxy.drop_seen.wait(30), "no Produce response was dropped"
        b.kill9()  # the batch whose response was lost is committed; the producer will retry
        b.start()
        proxy.release()
        writer.join(90)
        assert len(results) == 1, "the producer did not finish"
        (acks,) = results
        got = consume(f"127.0.0.1:{proxy_port}", topic, {0: 0}, n)
        assert [r.value for r in got] == [item["value"] for item in items]
        assert sorted((a.offset, a.value) for a in acks) == [(r.offset, r.value) for r in got]
    finally:
        proxy.stop()
        b.stop()
