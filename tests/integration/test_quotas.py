"""Client quotas (issue 12) against a real broker process: AlterClientQuotas and
DescribeClientQuotas over TCP (kafka-python's protocol classes: neither kafka-python's nor
confluent-kafka's admin client has these calls), then confluent-kafka clients throttled to
their produce and fetch byte rates through ``throttle_time_ms`` (reported to the clients'
throttle callbacks) while an unlimited client id is not throttled at all."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import (
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
)

from tests.fixtures.broker import BrokerProcess, start_broker
from tests.integration.kafka_raw import RawConn

pytestmark = pytest.mark.integration

WAIT = 60.0
RATE = 20_000  # bytes/s
VALUE = b"q" * 1000
COUNT = 340  # ~340 KB: 17 s of quota, 10 of them free (Kafka's 11 x 1 s window)
_AEntry = AlterClientQuotasRequest.EntryData


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = start_broker(tmp_path_factory.mktemp("quotas"))
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic("q", num_partitions=1)])["q"].result(WAIT)
        yield b
    finally:
        b.stop()
    assert "Traceback" not in b.log_text()


def _alter(b: BrokerProcess, entity: list[tuple[str, str | None]], ops: list[Any]) -> Any:
    req = AlterClientQuotasRequest(
        entries=[
            _AEntry(
                entity=[_AEntry.EntityData(entity_type=t, entity_name=n) for t, n in entity],
                ops=[_AEntry.OpData(key=k, value=v, remove=r) for k, v, r in ops],
            )
        ],
        validate_only=False,
    )
    with RawConn(b.port) as c:
        return c.call(req, AlterClientQuotasResponse, 1).entries[0]


def _describe(b: BrokerProcess, etype: str, match_type: int, name: str | None) -> Any:
    comp = DescribeClientQuotasRequest.ComponentData(
        entity_type=etype, match_type=match_type, match=name
    )
    req = DescribeClientQuotasRequest(components=[comp], strict=False)
    with RawConn(b.port) as c:
        return c.call(req, DescribeClientQuotasResponse, 1)


def test_quotas_altered_described_and_refused(broker: BrokerProcess) -> None:
    ok = _alter(broker, [("client-id", "slow")], [("producer_byte_rate", float(RATE), False)])
    assert ok.error_code == 0
    ok = _alter(broker, [("client-id", "slowc")], [("consumer_byte_rate", float(RATE), False)])
    assert ok.error_code == 0
    got = _describe(broker, "client-id", 0, "slow")
    assert got.error_code == 0
    (entry,) = got.entries
    assert [(e.entity_type, e.entity_name) for e in entry.entity] == [("client-id", "slow")]
    assert [(v.key, v.value) for v in entry.values] == [("producer_byte_rate", float(RATE))]
    bad = _alter(broker, [("ip", "127.0.0.1")], [("connection_creation_rate", 5.0, False)])
    assert bad.error_code == 42 and "not enforced" in bad.error_message


def _produce(b: BrokerProcess, client_id: str) -> tuple[list[int], float]:
    throttles: list[int] = []

    def on_throttle(ev: Any) -> None:
        throttles.append(int(ev.throttle_time * 1000))

    p = Producer(
        {
            "bootstrap.servers": b.bootstrap,
            "client.id": client_id,
            "batch.size": 4096,
            "linger.ms": 0,
            "throttle_cb": on_throttle,
        }
    )
    start = time.monotonic()
    for _ in range(COUNT):
        p.produce("q", value=VALUE)
        p.poll(0)
    assert p.flush(WAIT * 2) == 0
    p.poll(0)
    return throttles, time.monotonic() - start


def test_producer_throttled_to_its_rate(broker: BrokerProcess) -> None:
    test_quotas_altered_described_and_refused(broker)  # the quotas, whatever the order
    throttles, elapsed = _produce(broker, "slow")
    sent = COUNT * len(VALUE)
    print(f"slow: {sent} B in {elapsed:.1f} s, throttle reports (ms): {throttles}")
    # ~340 KB at 20 KB/s with 10 s of window credit: seconds of throttling reported
    assert throttles and sum(throttles) >= 2000
    # and the producer really slowed down: sending takes at least half the time the quota
    # asks for beyond the window's credit (a slow machine only makes it take longer)
    assert elapsed >= (sent / RATE - 11) / 2
    fast, _ = _produce(broker, "fast")
    assert fast == []  # no quota for this client id: never throttled


def test_consumer_throttled_to_its_fetch_rate(broker: BrokerProcess) -> None:
    test_quotas_altered_described_and_refused(broker)
    throttles: list[int] = []

    def on_throttle(ev: Any) -> None:
        throttles.append(int(ev.throttle_time * 1000))

    c = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "client.id": "slowc",
            "group.id": "slowc",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "max.partition.fetch.bytes": 65536,
            "throttle_cb": on_throttle,
        }
    )
    try:
        c.subscribe(["q"])
        got = 0
        deadline = time.monotonic() + WAIT * 2
        while got < COUNT and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got += 1
        assert got >= COUNT
    finally:
        c.close()
    print(f"slowc throttle reports (ms): {throttles}")
    assert throttles and sum(throttles) >= 1000
