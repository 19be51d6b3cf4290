"""confluent-kafka (librdkafka) against real ``kafscale broker`` processes over TCP.

Most tests run on the session broker of each backend (``any_broker``: local store +
embedded metadata, then SeaweedFS S3 + etcd) with topics of their own. Idempotence
under lost responses and ``kill -9`` recovery are in ``test_clients_confluent_recovery``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.broker import BrokerProcess, start_broker
from tests.integration.conftest import (
    CODECS,
    TIMEOUT,
    create_topic,
    payload,
    unique_topic,
)

pytestmark = pytest.mark.integration


@dataclass(frozen=True, slots=True)
class Rec:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int


@dataclass(frozen=True, slots=True)
class Ack:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def producer(bootstrap: str, **conf: Any) -> Any:
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, **conf})


def produce_acked(p: Any, topic: str, items: list[dict[str, Any]]) -> list[Ack]:
    """Produce every item, flush, and return the delivery reports (asserting none failed)."""
    acks: list[Ack] = []
    errors: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            acks.append(Ack(msg.partition(), msg.offset(), msg.key(), msg.value()))

    for item in items:
        p.produce(topic, on_delivery=on_delivery, **item)
        p.poll(0)
    assert p.flush(TIMEOUT) == 0
    assert errors == []
    assert len(acks) == len(items)
    return acks


def consumer(bootstrap: str, **conf: Any) -> Any:
    from confluent_kafka import Consumer

    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "client-tests",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **conf,
        }
    )


def _rec(m: Any) -> Rec:
    return Rec(
        m.partition(),
        m.offset(),
        m.key(),
        m.value(),
        tuple(m.headers() or ()),
        m.timestamp()[1],
    )


def consume(
    bootstrap: str,
    topic: str,
    starts: dict[int, int],
    count: int,
    timeout: float = TIMEOUT,
    **conf: Any,
) -> list[Rec]:
    """Assign ``{partition: start offset}`` and read exactly ``count`` records (or fail)."""
    from confluent_kafka import TopicPartition

    c = consumer(bootstrap, **conf)
    try:
        c.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
        out = drain(c, count, timeout)
        # nothing more than expected arrives
        extra = [m for m in c.consume(num_messages=10, timeout=0.3) if m.error() is None]
        assert extra == [], f"unexpected extra records: {[_rec(m) for m in extra]}"
        return out
    finally:
        c.close()


def drain(c: Any, count: int, timeout: float = TIMEOUT) -> list[Rec]:
    """Exactly ``count`` records from an assigned consumer (errors fail the test)."""
    out: list[Rec] = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        for m in c.consume(num_messages=count - len(out), timeout=0.5):
            assert m.error() is None, m.error()
            out.append(_rec(m))
    assert len(out) == count, f"got {len(out)} of {count} records"
    return out


@pytest.mark.parametrize("codec", CODECS)
def test_roundtrip_keys_values_headers_nulls(any_broker: BrokerProcess, codec: str) -> None:
    topic = unique_topic(f"cf-rt-{codec}")
    base_ts = 1_700_000_000_000
    items: list[dict[str, Any]] = [
        {"key": b"k0", "value": b"plain", "headers": [("h1", b"a"), ("h2", b"")]},
        {"key": None, "value": b"null-key", "timestamp": base_ts},
        {"key": b"tombstone", "value": None, "headers": [("dup", b"1"), ("dup", b"2")]},
        {"key": None, "value": None, "headers": [("nullhdr", None)]},
        {"key": b"\x00\xff" * 10, "value": bytes(range(256)) * 40, "timestamp": base_ts + 7},
    ]
    items += [{"key": f"k{i}".encode(), "value": payload(i, 300)} for i in range(200)]
    p = producer(any_broker.bootstrap, **{"compression.type": codec, "linger.ms": 20})
    t_before = int(time.time() * 1000)
    acks = produce_acked(p, topic, items)
    assert sorted(a.offset for a in acks) == list(range(len(items)))

    got = consume(any_broker.bootstrap, topic, {0: 0}, len(items))
    assert [r.offset for r in got] == list(range(len(items)))
    for r, item in zip(got, items, strict=True):
        assert (r.key, r.value) == (item.get("key"), item.get("value"))
        assert list(r.headers) == list(item.get("headers", []))
        if "timestamp" in item:
            assert r.timestamp == item["timestamp"]
        else:
            assert t_before - 1000 <= r.timestamp <= int(time.time() * 1000) + 1000


def test_mixed_codecs_and_acks_in_one_partition(any_broker: BrokerProcess) -> None:
    """Batches of every codec, produced with acks 0, 1 and all, interleave in one partition
    and read back in order (a fetch response mixes codecs)."""
    topic = unique_topic("cf-mixed")
    expected: list[bytes] = []
    for rnd in range(3):
        for codec in CODECS:
            acks = ("0", "1", "all")[(rnd + len(expected)) % 3]
            p = producer(any_broker.bootstrap, **{"compression.type": codec, "acks": acks})
            values = [b"%s-%d-%d" % (codec.encode(), rnd, i) for i in range(40)]
            reports = produce_acked(p, topic, [{"value": v} for v in values])
            if acks == "0":  # no response: the offset is unknown to the producer
                assert {r.offset for r in reports} <= {None, -1}
                # the producer is gone at once (closing its connection), yet its records
                # land: the first of them also auto-creates the topic
                del p
                landed = consume(any_broker.bootstrap, topic, {0: len(expected)}, 40)
                assert [r.value for r in landed] == values
            else:
                assert [r.offset for r in reports] == list(range(len(expected), len(expected) + 40))
            expected += values
    got = consume(any_broker.bootstrap, topic, {0: 0}, len(expected))
    assert [(r.offset, r.value) for r in got] == list(enumerate(expected))


def test_keyed_partitioning_16_partitions(any_broker: BrokerProcess) -> None:
    topic = unique_topic("cf-keyed")
    create_topic(any_broker.bootstrap, topic, 16)
    keys = [f"user-{k}".encode() for k in range(64)]
    items = [{"key": keys[i % 64], "value": f"{i}".encode()} for i in range(64 * 15)]
    p = producer(any_broker.bootstrap, **{"compression.type": "lz4", "linger.ms": 10})
    acks = produce_acked(p, topic, items)
    ack_part = {a.value: a.partition for a in acks}
    ends = {part: 0 for part in range(16)}
    for a in acks:
        ends[a.partition] = max(ends[a.partition], a.offset + 1)
    assert len([e for e in ends.values() if e]) >= 12  # 64 keys spread over the partitions

    got = consume(any_broker.bootstrap, topic, {part: 0 for part in range(16)}, len(items))
    key_part: dict[bytes, int] = {}
    last_seq: dict[bytes, int] = {}
    for r in got:
        assert r.key is not None and r.value is not None
        assert key_part.setdefault(r.key, r.partition) == r.partition
        assert ack_part[r.value] == r.partition
        seq = int(r.value)
        assert seq > last_seq.get(r.key, -1), "per-key order broken"
        last_seq[r.key] = seq
    per_part: dict[int, list[int]] = {}
    for r in got:
        per_part.setdefault(r.partition, []).append(r.offset)
    for part, offs in per_part.items():
        assert offs == list(range(ends[part])), part
    assert len(key_part) == 64


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_large_messages_and_batches(any_broker: BrokerProcess, codec: str) -> None:
    topic = unique_topic(f"cf-large-{codec}")
    big = [payload(i, 1_500_000 + i) for i in range(3)]
    small = [payload(100 + i, 8_000) for i in range(300)]  # one ~2.4 MiB batch
    conf = {
        "compression.type": codec,
        "message.max.bytes": 8_000_000,
        "batch.size": 8_000_000,
        "linger.ms": 200,
    }
    p = producer(any_broker.bootstrap, **conf)
    acks = produce_acked(p, topic, [{"value": v} for v in big])
    acks += produce_acked(p, topic, [{"key": b"s", "value": v} for v in small])
    assert sorted(a.offset for a in acks) == list(range(303))
    got = consume(
        any_broker.bootstrap, topic, {0: 0}, 303, **{"fetch.message.max.bytes": 1_000_000}
    )
    assert [r.value for r in got] == big + small
    assert [r.offset for r in got] == list(range(303))


def test_list_offsets_and_offsets_for_times(any_broker: BrokerProcess) -> None:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    topic = unique_topic("cf-offsets")
    create_topic(any_broker.bootstrap, topic, 2)
    base = 1_600_000_000_000
    p = producer(any_broker.bootstrap, **{"linger.ms": 5})
    # 20 records on partition 0 with timestamps base, base+1000, ...; batches of 5
    for chunk in range(4):
        items = [
            {"partition": 0, "value": b"x", "timestamp": base + 1000 * i}
            for i in range(chunk * 5, chunk * 5 + 5)
        ]
        produce_acked(p, topic, items)
    c = consumer(any_broker.bootstrap)
    try:
        assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT) == (0, 20)
        assert c.get_watermark_offsets(TopicPartition(topic, 1), timeout=TIMEOUT) == (0, 0)
        queries = [
            TopicPartition(topic, 0, base - 1),
            TopicPartition(topic, 0, base + 5500),  # between records 5 and 6
            TopicPartition(topic, 0, base + 12_000),  # exactly record 12, mid-batch
            TopicPartition(topic, 0, base + 99_000),  # after the last
            TopicPartition(topic, 1, base),  # empty partition
        ]
        res = []
        for q in queries:
            (tp,) = c.offsets_for_times([q], timeout=TIMEOUT)
            assert tp.error is None
            res.append(tp.offset)
        assert res == [0, 6, 12, -1, -1]
    finally:
        c.close()

    admin = AdminClient({"bootstrap.servers": any_broker.bootstrap})
    tp0 = TopicPartition(topic, 0)
    for spec, want in [
        (OffsetSpec.earliest(), 0),
        (OffsetSpec.latest(), 20),
        (OffsetSpec.max_timestamp(), 19),
        (OffsetSpec.for_timestamp(base + 3000), 3),
    ]:
        (fut,) = admin.list_offsets({tp0: spec}, request_timeout=TIMEOUT).values()
        assert fut.result(timeout=TIMEOUT).offset == want


def test_log_append_time_topic(shared_broker: BrokerProcess) -> None:
    from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": shared_broker.bootstrap})
    topics = {name: unique_topic(f"cf-ts-{name}") for name in ("create", "append")}
    futs = admin.create_topics(
        [
            NewTopic(topics["create"], 1, 1),
            NewTopic(topics["append"], 1, 1, config={"message.timestamp.type": "LogAppendTime"}),
        ]
    )
    for fut in futs.values():
        fut.result(timeout=TIMEOUT)
    old = 1_000_000_000_000
    p = producer(shared_broker.bootstrap, **{"linger.ms": 20})
    for name, topic in topics.items():
        before = int(time.time() * 1000)
        produce_acked(p, topic, [{"value": b"%d" % i, "timestamp": old + i} for i in range(5)])
        got = consume(shared_broker.bootstrap, topic, {0: 0}, 5)
        c = consumer(shared_broker.bootstrap)
        try:
            c.assign([TopicPartition(topic, 0, 0)])
            m = c.poll(TIMEOUT)
            assert m is not None and m.error() is None
            ts_type, ts = m.timestamp()
        finally:
            c.close()
        if name == "create":
            assert ts_type == TIMESTAMP_CREATE_TIME
            assert [r.timestamp for r in got] == [old + i for i in range(5)]
        else:
            assert ts_type == TIMESTAMP_LOG_APPEND_TIME
            assert before - 1000 <= ts <= int(time.time() * 1000) + 1000
            stamps = [r.timestamp for r in got]  # the broker's clock, not the producer's
            assert stamps == sorted(stamps)
            assert before - 1000 <= stamps[0] and stamps[-1] <= int(time.time() * 1000) + 1000


def test_seek_into_middle_of_batch(any_broker: BrokerProcess) -> None:
    from confluent_kafka import TopicPartition

    topic = unique_topic("cf-seek")
    p = producer(any_broker.bootstrap, **{"linger.ms": 200, "compression.type": "snappy"})
    produce_acked(p, topic, [{"value": f"m{i}".encode()} for i in range(10)])  # one batch
    got = consume(any_broker.bootstrap, topic, {0: 5}, 5)
    assert [(r.offset, r.value) for r in got] == [(i, f"m{i}".encode()) for i in range(5, 10)]

    c = consumer(any_broker.bootstrap)
    try:
        c.assign([TopicPartition(topic, 0, 8)])
        m = c.poll(TIMEOUT)
        assert m is not None and m.error() is None and m.offset() == 8
        c.seek(TopicPartition(topic, 0, 3))
        m = c.poll(TIMEOUT)
        assert m is not None and m.error() is None and (m.offset(), m.value()) == (3, b"m3")
    finally:
        c.close()


@pytest.mark.parametrize("reset", ["earliest", "latest", "error"])
def test_offset_out_of_range_reset(shared_broker: BrokerProcess, reset: str) -> None:
    from confluent_kafka import KafkaError, TopicPartition

    topic = unique_topic(f"cf-oor-{reset}")
    p = producer(shared_broker.bootstrap)
    produce_acked(p, topic, [{"value": f"old{i}".encode()} for i in range(5)])
    c = consumer(shared_broker.bootstrap, **{"auto.offset.reset": reset})
    try:
        c.assign([TopicPartition(topic, 0, 1000)])
        if reset == "earliest":
            m = c.poll(TIMEOUT)
            assert m is not None and m.error() is None and (m.offset(), m.value()) == (0, b"old0")
        elif reset == "latest":
            assert c.poll(1.5) is None  # reset to the end: the old records are skipped
            produce_acked(p, topic, [{"value": b"new"}])
            m = c.poll(TIMEOUT)
            assert m is not None and m.error() is None and (m.offset(), m.value()) == (5, b"new")
        else:
            m = c.poll(TIMEOUT)
            assert m is not None and m.error() is not None
            assert m.error().code() == KafkaError._AUTO_OFFSET_RESET
    finally:
        c.close()


def test_long_poll_fetch_is_woken_by_produce(any_broker: BrokerProcess) -> None:
    """A consumer waiting at the log end (fetch.wait.max.ms=5s) gets a new record at once."""
    from confluent_kafka import TopicPartition

    topic = unique_topic("cf-longpoll")
    p = producer(any_broker.bootstrap, **{"linger.ms": 0})
    produce_acked(p, topic, [{"value": b"first"}])
    c = consumer(any_broker.bootstrap, **{"fetch.wait.max.ms": 5000})
    try:
        c.assign([TopicPartition(topic, 0, 1)])
        assert c.poll(1.0) is None  # the fetch is now parked at the log end
        delays = []
        for i in range(3):
            t0 = time.monotonic()
            produce_acked(p, topic, [{"value": b"%d" % i}])
            m = c.poll(TIMEOUT)
            delays.append(time.monotonic() - t0)
            assert (
                m is not None
                and m.error() is None
                and (m.offset(), m.value()) == (1 + i, b"%d" % i)
            )
        assert max(delays) < 2.0, delays
    finally:
        c.close()


def test_concurrent_produce_and_consume(any_broker: BrokerProcess) -> None:
    """A consumer tailing the log while a producer streams sees every record in order."""
    topic = unique_topic("cf-tail")
    p = producer(any_broker.bootstrap, **{"linger.ms": 1, "batch.num.messages": 30})
    produce_acked(p, topic, [{"value": b"0"}])
    n = 3000
    result: list[list[Rec]] = []
    reader = threading.Thread(
        target=lambda: result.append(consume(any_broker.bootstrap, topic, {0: 0}, n + 1, 40.0))
    )
    reader.start()
    for start in range(1, n + 1, 100):
        produce_acked(p, topic, [{"value": b"%d" % i} for i in range(start, start + 100)])
    reader.join(60)
    assert not reader.is_alive() and len(result) == 1
    assert [(r.offset, r.value) for r in result[0]] == [(i, b"%d" % i) for i in range(n + 1)]


def test_idempotent_producer_exact_count(any_broker: BrokerProcess) -> None:
    topic = unique_topic("cf-idem")
    create_topic(any_broker.bootstrap, topic, 4)
    p = producer(
        any_broker.bootstrap,
        **{"enable.idempotence": True, "linger.ms": 2, "max.in.flight": 5, "batch.size": 20_000},
    )
    n = 5000
    acks = produce_acked(
        p, topic, [{"key": f"{i % 97}".encode(), "value": b"%d" % i} for i in range(n)]
    )
    ends = {part: 1 + max(a.offset for a in acks if a.partition == part) for part in range(4)}
    assert sum(ends.values()) == n
    got = consume(any_broker.bootstrap, topic, {part: 0 for part in range(4)}, n)
    assert sorted(int(r.value or b"") for r in got) == list(range(n))
    assert {(a.partition, a.offset, a.value) for a in acks} == {
        (r.partition, r.offset, r.value) for r in got
    }


def test_metadata_auto_create_on_and_off(shared_broker: BrokerProcess, tmp_path: Path) -> None:
    from confluent_kafka import KafkaError

    name = unique_topic("cf-auto")
    p = producer(shared_broker.bootstrap)
    md = p.list_topics(name, timeout=TIMEOUT)  # producer metadata requests allow auto-create
    assert md.topics[name].error is None and len(md.topics[name].partitions) == 1
    produce_acked(p, name, [{"value": b"v"}])

    off = start_broker(tmp_path / "off", extra_args=("--auto-create-topics", "false"))
    try:
        conf = {"message.timeout.ms": 10_000, "topic.metadata.propagation.max.ms": 1000}
        p = producer(off.bootstrap, **conf)
        md = p.list_topics(name, timeout=TIMEOUT)
        assert md.topics[name].error is not None
        assert md.topics[name].error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        errors: list[Any] = []
        p.produce(name, b"v", on_delivery=lambda err, _m: errors.append(err))
        p.flush(TIMEOUT)
        assert len(errors) == 1 and errors[0] is not None
        assert errors[0].code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)
        assert name not in p.list_topics(timeout=TIMEOUT).topics
        create_topic(off.bootstrap, name, 2)  # explicit creation still works
        acks = produce_acked(producer(off.bootstrap), name, [{"partition": 1, "value": b"v"}])
        assert [(a.partition, a.offset) for a in acks] == [(1, 0)]
    finally:
        off.stop()
