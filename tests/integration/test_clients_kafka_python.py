"""kafka-python 3.x (pure Python client) against a real ``kafscale broker`` over TCP.

kafka-python here has gzip and zstd (zstandard); its snappy and lz4 codecs need the
``python-snappy``/``lz4`` packages, which this environment does not install, so those two
codecs are covered by the other clients.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.broker import BrokerProcess, start_broker
from tests.integration.conftest import (
    TIMEOUT,
    broker_behind_dropping_proxy,
    create_topic,
    payload,
    unique_topic,
)

pytestmark = pytest.mark.integration

KP_CODECS = (None, "gzip", "zstd")


def kproducer(bootstrap: str, **conf: Any) -> Any:
    from kafka import KafkaProducer

    return KafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=15_000, **conf)


def kconsumer(bootstrap: str, **conf: Any) -> Any:
    from kafka import KafkaConsumer

    conf.setdefault("auto_offset_reset", "earliest")
    return KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **conf)


def send_all(p: Any, topic: str, items: list[dict[str, Any]]) -> list[Any]:
    futs = [p.send(topic, **item) for item in items]
    p.flush(timeout=TIMEOUT)
    return [f.get(timeout=TIMEOUT) for f in futs]


def read(c: Any, count: int, timeout: float = TIMEOUT) -> list[Any]:
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        for recs in c.poll(timeout_ms=500, max_records=count - len(out)).values():
            out.extend(recs)
    assert len(out) == count, f"got {len(out)} of {count}"
    assert not any(c.poll(timeout_ms=300).values()), "unexpected extra records"
    return out


@pytest.mark.parametrize("codec", KP_CODECS)
def test_roundtrip_keys_values_headers_nulls(any_broker: BrokerProcess, codec: str | None) -> None:
    from kafka import TopicPartition

    topic = unique_topic(f"kp-rt-{codec}")
    ts = 1_700_000_000_123
    items: list[dict[str, Any]] = [
        {"key": b"k", "value": b"v", "headers": [("h", b"1"), ("h", b"2")]},
        {"key": None, "value": b"no key", "timestamp_ms": ts},
        {"key": b"tomb", "value": None},
        {"key": None, "value": b"", "headers": [("empty", b"")]},  # key+value None: refused
    ]
    items += [{"key": b"%d" % i, "value": payload(i, 500)} for i in range(150)]
    p = kproducer(any_broker.bootstrap, compression_type=codec, linger_ms=20)
    try:
        metas = send_all(p, topic, items)
    finally:
        p.close(timeout=5)
    assert [m.offset for m in metas] == list(range(len(items)))
    assert metas[1].timestamp == ts

    c = kconsumer(any_broker.bootstrap)
    try:
        c.assign([TopicPartition(topic, 0)])
        got = read(c, len(items))
    finally:
        c.close()
    assert [r.offset for r in got] == list(range(len(items)))
    for r, item in zip(got, items, strict=True):
        assert (r.key, r.value) == (item["key"], item["value"])
        assert list(r.headers) == item.get("headers", [])
    assert got[1].timestamp == ts


def test_keyed_partitioning_16_partitions(any_broker: BrokerProcess) -> None:
    from kafka import TopicPartition

    topic = unique_topic("kp-keyed")
    create_topic(any_broker.bootstrap, topic, 16)
    items = [{"key": b"key-%d" % (i % 40), "value": b"%d" % i} for i in range(800)]
    p = kproducer(any_broker.bootstrap, compression_type="gzip", linger_ms=10)
    try:
        metas = send_all(p, topic, items)
    finally:
        p.close(timeout=5)
    c = kconsumer(any_broker.bootstrap)
    try:
        c.assign([TopicPartition(topic, part) for part in range(16)])
        got = read(c, len(items))
    finally:
        c.close()
    sent_part = {item["value"]: m.partition for item, m in zip(items, metas, strict=True)}
    key_part: dict[bytes, int] = {}
    last: dict[bytes, int] = {}
    by_part: dict[int, list[int]] = {}
    for r in got:
        assert key_part.setdefault(r.key, r.partition) == r.partition
        assert sent_part[r.value] == r.partition
        assert int(r.value) > last.get(r.key, -1)
        last[r.key] = int(r.value)
        by_part.setdefault(r.partition, []).append(r.offset)
    assert all(offs == list(range(len(offs))) for offs in by_part.values())
    assert len(by_part) >= 10


def test_large_messages(shared_broker: BrokerProcess) -> None:
    from kafka import TopicPartition

    topic = unique_topic("kp-large")
    big = [payload(i, 1_200_000 + i) for i in range(2)]
    small = [payload(10 + i, 10_000) for i in range(150)]  # ~1.5 MiB batch
    p = kproducer(
        shared_broker.bootstrap,
        max_request_size=8_000_000,
        batch_size=4_000_000,
        linger_ms=100,
        compression_type="zstd",
    )
    try:
        metas = send_all(p, topic, [{"value": v} for v in big + small])
    finally:
        p.close(timeout=5)
    assert [m.offset for m in metas] == list(range(152))
    c = kconsumer(shared_broker.bootstrap, max_partition_fetch_bytes=1_048_576)
    try:
        c.assign([TopicPartition(topic, 0)])
        got = read(c, 152)
    finally:
        c.close()
    assert [r.value for r in got] == big + small


def test_offsets_for_times_and_seek(shared_broker: BrokerProcess) -> None:
    from kafka import TopicPartition

    topic = unique_topic("kp-times")
    base = 1_650_000_000_000
    p = kproducer(shared_broker.bootstrap, linger_ms=50)
    try:
        # one batch of 10 records, timestamps base, base+100, ...
        send_all(
            p, topic, [{"value": b"m%d" % i, "timestamp_ms": base + 100 * i} for i in range(10)]
        )
    finally:
        p.close(timeout=5)
    tp = TopicPartition(topic, 0)
    c = kconsumer(shared_broker.bootstrap)
    try:
        assert c.beginning_offsets([tp]) == {tp: 0}
        assert c.end_offsets([tp]) == {tp: 10}
        found = c.offsets_for_times({tp: base + 450})
        assert found[tp] is not None and (found[tp].offset, found[tp].timestamp) == (5, base + 500)
        assert c.offsets_for_times({tp: base + 10_000}) == {tp: None}
        c.assign([tp])
        c.seek(tp, found[tp].offset)  # the middle of the batch
        got = read(c, 5)
        assert [(r.offset, r.value) for r in got] == [(i, b"m%d" % i) for i in range(5, 10)]
        c.seek(tp, 7)
        assert [r.offset for r in read(c, 3)] == [7, 8, 9]
    finally:
        c.close()


@pytest.mark.parametrize("reset", ["earliest", "latest"])
def test_offset_out_of_range_reset(shared_broker: BrokerProcess, reset: str) -> None:
    from kafka import TopicPartition

    topic = unique_topic(f"kp-oor-{reset}")
    p = kproducer(shared_broker.bootstrap)
    try:
        send_all(p, topic, [{"value": b"old%d" % i} for i in range(4)])
        tp = TopicPartition(topic, 0)
        c = kconsumer(shared_broker.bootstrap, auto_offset_reset=reset)
        try:
            c.assign([tp])
            c.seek(tp, 500)
            if reset == "earliest":
                got = read(c, 4)
                assert [r.value for r in got] == [b"old%d" % i for i in range(4)]
            else:
                deadline = time.monotonic() + TIMEOUT
                while c.position(tp) != 4 and time.monotonic() < deadline:
                    assert not any(c.poll(timeout_ms=200).values())
                assert c.position(tp) == 4
                send_all(p, topic, [{"value": b"new"}])
                assert [(r.offset, r.value) for r in read(c, 1)] == [(4, b"new")]
        finally:
            c.close()
    finally:
        p.close(timeout=5)


def test_idempotent_producer(shared_broker: BrokerProcess) -> None:
    from kafka import TopicPartition

    topic = unique_topic("kp-idem")
    create_topic(shared_broker.bootstrap, topic, 3)
    n = 1500
    p = kproducer(shared_broker.bootstrap, enable_idempotence=True, acks="all", linger_ms=5)
    try:
        metas = send_all(
            p, topic, [{"key": b"%d" % (i % 11), "value": b"%d" % i} for i in range(n)]
        )
    finally:
        p.close(timeout=5)
    c = kconsumer(shared_broker.bootstrap)
    try:
        c.assign([TopicPartition(topic, part) for part in range(3)])
        got = read(c, n)
    finally:
        c.close()
    assert sorted(int(r.value) for r in got) == list(range(n))
    assert {(m.partition, m.offset) for m in metas} == {(r.partition, r.offset) for r in got}


def test_idempotent_retries_of_lost_responses(tmp_path: Path) -> None:
    """Every 5th Produce response is cut off after the commit; retries must not duplicate."""
    from kafka import TopicPartition

    with broker_behind_dropping_proxy(tmp_path / "b", drop_every=5) as (b, proxy, bootstrap):
        topic = unique_topic("kp-idem-retry")
        p = kproducer(
            bootstrap,
            enable_idempotence=True,
            acks="all",
            linger_ms=2,
            batch_size=2000,
            retries=50,
            retry_backoff_ms=20,
            reconnect_backoff_ms=20,
            delivery_timeout_ms=60_000,
        )
        n = 1000
        items = [{"key": b"%d" % (i % 3), "value": b"%d" % i} for i in range(n)]
        metas: list[Any] = []
        try:
            for start in range(0, n, 40):  # many small requests
                metas += send_all(p, topic, items[start : start + 40])
        finally:
            p.close(timeout=5)
        assert proxy.dropped >= 3, (proxy.dropped, proxy.produce_responses)
        c = kconsumer(bootstrap)
        try:
            c.assign([TopicPartition(topic, part) for part in range(2)])
            got = read(c, n)
        finally:
            c.close()
        assert sorted(int(r.value) for r in got) == list(range(n))
        assert {(m.partition, m.offset) for m in metas} == {(r.partition, r.offset) for r in got}


@pytest.mark.parametrize(
    "api_version", [(0, 9), (0, 10, 1), (0, 11), (1, 1), (2, 1), (2, 4), (3, 0)], ids=str
)
def test_older_protocol_versions(
    shared_broker: BrokerProcess, api_version: tuple[int, ...]
) -> None:
    """A client pinned to an older broker version uses older Produce/Fetch/ListOffsets
    versions (down to Produce 0-2 with magic 0/1 message sets, which the broker converts
    to v2 batches on arrival)."""
    from kafka import TopicPartition

    topic = unique_topic("kp-av")
    ts = 1_690_000_000_000
    has_ts = api_version >= (0, 10)
    has_headers = api_version >= (0, 11)
    items: list[dict[str, Any]] = []
    for i in range(6):
        item: dict[str, Any] = {"key": b"k%d" % i, "value": b"v%d" % i}
        if has_ts:
            item["timestamp_ms"] = ts + i
        if has_headers:
            item["headers"] = [("n", b"%d" % i)]
        items.append(item)
    p = kproducer(shared_broker.bootstrap, api_version=api_version, linger_ms=20)
    try:
        metas = send_all(p, topic, items)
    finally:
        p.close(timeout=5)
    assert [m.offset for m in metas] == list(range(6))
    # the same old client reads back too, except below 0.11: the broker serves Fetch 4+
    # only (Fetch 0-3 would need v2 batches down-converted to message sets)
    readers = [None] if api_version < (0, 11) else [api_version, None]
    for reader_version in readers:
        conf: dict[str, Any] = {} if reader_version is None else {"api_version": reader_version}
        c = kconsumer(shared_broker.bootstrap, **conf)
        try:
            tp = TopicPartition(topic, 0)
            c.assign([tp])
            c.seek(tp, 2)
            got = read(c, 4)
            assert c.end_offsets([tp]) == {tp: 6}
        finally:
            c.close()
        assert [(r.offset, r.key, r.value) for r in got] == [
            (i, b"k%d" % i, b"v%d" % i) for i in range(2, 6)
        ]
        if has_ts:
            assert [r.timestamp for r in got] == [ts + i for i in range(2, 6)]
        if has_headers:
            assert [r.headers for r in got] == [[("n", b"%d" % i)] for i in range(2, 6)]


# The consumer runs in a child process: kafka-python 3.0.12 leaves the socket of a refused
# connection attempt unclosed (kafka/net/inet.py), and in this process the ResourceWarning
# would surface after the test, at the session's end.
_LIVE_CONSUMER = """
import json, sys, time
from kafka import KafkaConsumer, TopicPartition
bootstrap, topic, before_n, total = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                  auto_offset_reset="earliest", max_partition_fetch_bytes=1000,
                  reconnect_backoff_ms=50, reconnect_backoff_max_ms=300,
                  request_timeout_ms=15000)
c.assign([TopicPartition(topic, p) for p in range(3)])
seen = []
def read(n):
    deadline = time.monotonic() + 30
    while len(seen) < n and time.monotonic() < deadline:
        for recs in c.poll(timeout_ms=500, max_records=n - len(seen)).values():
            seen.extend((r.partition, r.offset) for r in recs)
read(before_n)
print("READY", len(seen), flush=True)
sys.stdin.readline()
read(total)
extra = c.poll(timeout_ms=500)
seen.extend((r.partition, r.offset) for recs in extra.values() for r in recs)
c.close()
print(json.dumps(seen), flush=True)
"""


def test_consumer_lives_through_broker_kill9(tmp_path: Path) -> None:
    """A consumer mid-log when the broker is killed resumes after the restart (new leader
    epoch) with no gap and no duplicate, and then sees records produced afterwards."""
    b = start_broker(tmp_path / "b", extra_args=("--default-partitions", "3"))
    child: subprocess.Popen[str] | None = None
    try:
        topic = unique_topic("kp-live")
        p = kproducer(b.bootstrap, acks="all", linger_ms=5)
        try:
            items = [{"key": b"%d" % i, "value": b"%d" % i} for i in range(300)]
            metas = send_all(p, topic, items)
        finally:
            p.close(timeout=5)
        ends = {part: 1 + max(m.offset for m in metas if m.partition == part) for part in range(3)}
        child = subprocess.Popen(
            [
                sys.executable,
                "-W",
                "ignore",
                "-c",
                _LIVE_CONSUMER,
                b.bootstrap,
                topic,
                "100",
                "303",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert child.stdin is not None and child.stdout is not None
        assert child.stdout.readline().split() == ["READY", "100"]
        b.kill9()
        b.start()
        p = kproducer(b.bootstrap, acks="all")
        try:
            send_all(p, topic, [{"partition": part, "value": b"after"} for part in range(3)])
        finally:
            p.close(timeout=5)
        child.stdin.write("go\n")
        child.stdin.flush()
        out, _ = child.communicate(timeout=60)
        seen = sorted(tuple(x) for x in json.loads(out))
        assert seen == [(part, o) for part in range(3) for o in range(ends[part] + 1)]
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait(10)
        b.stop()
