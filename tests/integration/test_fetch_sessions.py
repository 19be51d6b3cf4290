"""KIP-227 fetch sessions with a real client (issue 12): kafka-python's consumer (which
uses incremental fetch sessions, as the Java client does; librdkafka does not) reads a
1000-partition topic through a counting proxy, from a broker with sessions and from one
started with ``--max-fetch-sessions 0``. Every record is consumed exactly once either
way; with sessions, idle fetch requests and responses are a small fraction of the size."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, TopicPartition

from protocol.apis import ApiKey
from tests.fixtures.broker import BrokerProcess, free_port, start_broker
from tests.fixtures.byte_proxy import ApiBytes, ByteProxy

pytestmark = pytest.mark.integration

PARTITIONS = 1000
RECORDS = 3000
WAIT = 60.0
IDLE_POLLS = 15


@dataclass
class Target:
    broker: BrokerProcess
    proxy: ByteProxy

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.proxy.port}"


def _start(tmp: object, name: str, *extra: str) -> Target:
    listen = free_port()
    proxy = ByteProxy(listen).start()
    b = start_broker(
        tmp / name,  # type: ignore[operator]
        port=listen,
        extra_args=("--advertised-listener", f"127.0.0.1:{proxy.port}", *extra),
    )
    return Target(b, proxy)


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Target]]:
    tmp = tmp_path_factory.mktemp("fetch-sessions")
    out = {
        "sessions": _start(tmp, "sessions"),
        "sessionless": _start(tmp, "sessionless", "--max-fetch-sessions", "0"),
    }
    try:
        yield out
    finally:
        for t in out.values():
            t.broker.stop()
            t.proxy.stop()
    for t in out.values():
        assert "Traceback" not in t.broker.log_text()


def _fill(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("wide", num_partitions=PARTITIONS)])["wide"].result(WAIT)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(RECORDS):
        p.produce("wide", key=b"%d" % i, value=b"x" * 50, partition=i % PARTITIONS)
    assert p.flush(WAIT) == 0


def _diff(a: ApiBytes, b: ApiBytes) -> ApiBytes:
    return ApiBytes(
        b.requests - a.requests,
        b.request_bytes - a.request_bytes,
        b.responses - a.responses,
        b.response_bytes - a.response_bytes,
    )


def _consume(t: Target) -> tuple[set[bytes], ApiBytes]:
    """Every key of the topic; then the Fetch bytes of ``IDLE_POLLS`` idle polls."""
    c = KafkaConsumer(
        bootstrap_servers=t.bootstrap,
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
        request_timeout_ms=60000,
    )
    try:
        c.assign([TopicPartition("wide", p) for p in range(PARTITIONS)])
        c.seek_to_beginning()
        keys: list[bytes] = []
        deadline = time.monotonic() + WAIT
        while len(keys) < RECORDS:
            assert time.monotonic() < deadline, f"consumed {len(keys)} of {RECORDS}"
            for records in c.poll(timeout_ms=500).values():
                keys += [r.key for r in records]
        assert len(keys) == RECORDS and len(set(keys)) == RECORDS  # each record once
        for _ in range(3):  # the fetch sent after the last records moves every position
            assert not c.poll(timeout_ms=200)
        before = t.proxy.counts.snapshot(ApiKey.FETCH)
        for _ in range(IDLE_POLLS):
            assert not c.poll(timeout_ms=200)  # nothing new arrives
        after = t.proxy.counts.snapshot(ApiKey.FETCH)
        return set(keys), _diff(before, after)
    finally:
        c.close()


def test_consumer_on_1000_partitions_with_and_without_sessions(
    targets: dict[str, Target],
) -> None:
    idle: dict[str, ApiBytes] = {}
    for name, t in targets.items():
        _fill(t.bootstrap)
        keys, idle[name] = _consume(t)
        print(name, "idle:", idle[name], "whole run:", t.proxy.counts.snapshot(ApiKey.FETCH))
        assert keys == {b"%d" % i for i in range(RECORDS)}
        assert idle[name].requests >= 3 and idle[name].responses >= 3
    per = {
        name: (a.request_bytes / a.requests, a.response_bytes / a.responses)
        for name, a in idle.items()
    }
    print("idle fetch bytes per request/response:", per)
    # without a session every idle fetch names (and answers) all 1000 partitions
    assert per["sessionless"][0] > PARTITIONS * 10 and per["sessionless"][1] > PARTITIONS * 10
    # with one, an idle incremental fetch names and answers none of them
    assert per["sessions"][0] * 20 < per["sessionless"][0]
    assert per["sessions"][1] * 20 < per["sessionless"][1]


def test_sessions_die_with_the_broker_and_the_consumer_recovers(
    targets: dict[str, Target],
) -> None:
    """A restarted broker has no sessions: the consumer's next fetch starts a new one and
    every record, before and after the restart, is consumed exactly once."""
    t = targets["sessions"]
    admin = AdminClient({"bootstrap.servers": t.bootstrap})
    admin.create_topics([NewTopic("again", num_partitions=50)])["again"].result(WAIT)

    def produce(first: int, n: int) -> None:
        p = Producer({"bootstrap.servers": t.bootstrap, "linger.ms": 5})
        for i in range(first, first + n):
            p.produce("again", key=b"%d" % i, value=b"y", partition=i % 50)
        assert p.flush(WAIT) == 0

    c = KafkaConsumer(
        bootstrap_servers=t.bootstrap,
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
        request_timeout_ms=30000,
        reconnect_backoff_ms=50,
    )
    keys: list[bytes] = []

    def consume_until(n: int) -> None:
        deadline = time.monotonic() + WAIT
        while len(keys) < n:
            assert time.monotonic() < deadline, f"consumed {len(keys)} of {n}"
            for records in c.poll(timeout_ms=300).values():
                keys.extend(r.key for r in records)

    try:
        c.assign([TopicPartition("again", p) for p in range(50)])
        c.seek_to_beginning()
        produce(0, 500)
        consume_until(500)
        fetches_before = t.proxy.counts.snapshot(ApiKey.FETCH).requests
        t.broker.restart()
        produce(500, 500)
        consume_until(1000)
        for _ in range(3):
            c.poll(timeout_ms=200)  # nothing more, no duplicates
    finally:
        c.close()
    assert t.proxy.counts.snapshot(ApiKey.FETCH).requests > fetches_before
    assert sorted(keys) == sorted(b"%d" % i for i in range(1000))
