"""aiokafka (asyncio client, cramjam codecs) against a real ``kafscale broker`` over TCP."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.broker import BrokerProcess
from tests.integration.conftest import (
    TIMEOUT,
    broker_behind_dropping_proxy,
    create_topic,
    payload,
    unique_topic,
)

pytestmark = pytest.mark.integration

AIO_CODECS = (None, "gzip", "snappy", "lz4", "zstd")


async def read(c: Any, count: int, timeout: float = TIMEOUT) -> list[Any]:
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        batches = await c.getmany(timeout_ms=500, max_records=count - len(out))
        for recs in batches.values():
            out.extend(recs)
    assert len(out) == count, f"got {len(out)} of {count}"
    extra = await c.getmany(timeout_ms=300)
    assert not any(extra.values()), "unexpected extra records"
    return out


async def send_all(p: Any, topic: str, items: list[dict[str, Any]]) -> list[Any]:
    futs = [await p.send(topic, **item) for item in items]
    return list(await asyncio.wait_for(asyncio.gather(*futs), TIMEOUT))


def producer(bootstrap: str, **conf: Any) -> Any:
    from aiokafka import AIOKafkaProducer

    return AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=15_000, **conf)


def consumer(bootstrap: str, **conf: Any) -> Any:
    from aiokafka import AIOKafkaConsumer

    conf.setdefault("auto_offset_reset", "earliest")
    return AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **conf)


@pytest.mark.parametrize("codec", AIO_CODECS)
async def test_roundtrip_keys_values_headers_nulls(
    any_broker: BrokerProcess, codec: str | None
) -> None:
    from aiokafka import TopicPartition

    topic = unique_topic(f"aio-rt-{codec}")
    ts = 1_700_000_000_456
    items: list[dict[str, Any]] = [
        {"key": b"k", "value": b"v", "headers": [("a", b"1"), ("b", b"")]},
        {"key": None, "value": b"no key", "timestamp_ms": ts},
        {"key": b"tomb", "value": None},
        {"key": None, "value": b""},  # key and value both None: aiokafka refuses
    ]
    items += [{"key": b"%d" % i, "value": payload(i, 400)} for i in range(150)]
    p = producer(any_broker.bootstrap, compression_type=codec, linger_ms=20)
    await p.start()
    try:
        metas = await send_all(p, topic, items)
    finally:
        await p.stop()
    assert [m.offset for m in metas] == list(range(len(items)))

    c = consumer(any_broker.bootstrap)
    await c.start()
    try:
        c.assign([TopicPartition(topic, 0)])
        got = await read(c, len(items))
    finally:
        await c.stop()
    assert [r.offset for r in got] == list(range(len(items)))
    for r, item in zip(got, items, strict=True):
        assert (r.key, r.value) == (item["key"], item["value"])
        assert list(r.headers) == item.get("headers", [])
    assert got[1].timestamp == ts


async def test_keyed_partitions_idempotent_large(any_broker: BrokerProcess) -> None:
    """16 partitions, keyed records with an idempotent producer, plus ≥1 MiB records."""
    from aiokafka import TopicPartition

    topic = unique_topic("aio-keyed")
    create_topic(any_broker.bootstrap, topic, 16)
    items: list[dict[str, Any]] = [
        {"key": b"key-%d" % (i % 50), "value": b"%d" % i} for i in range(1000)
    ]
    big = [payload(i, 1_100_000) for i in range(2)]
    p = producer(
        any_broker.bootstrap,
        enable_idempotence=True,
        linger_ms=5,
        compression_type="lz4",
        max_request_size=8_000_000,
        max_batch_size=2_000_000,
    )
    await p.start()
    try:
        metas = await send_all(p, topic, items)
        big_metas = await send_all(p, topic, [{"key": b"big", "value": v} for v in big])
    finally:
        await p.stop()
    assert big_metas[0].partition == big_metas[1].partition
    c = consumer(any_broker.bootstrap, max_partition_fetch_bytes=1_048_576)
    await c.start()
    try:
        c.assign([TopicPartition(topic, part) for part in range(16)])
        got = await read(c, len(items) + 2)
    finally:
        await c.stop()
    assert [r.value for r in got if r.key == b"big"] == big
    sent = {item["value"]: m.partition for item, m in zip(items, metas, strict=True)}
    key_part: dict[bytes, int] = {}
    last: dict[bytes, int] = {}
    offsets: dict[int, list[int]] = {}
    for r in got:
        offsets.setdefault(r.partition, []).append(r.offset)
        if r.key == b"big":
            continue
        assert key_part.setdefault(r.key, r.partition) == r.partition == sent[r.value]
        assert int(r.value) > last.get(r.key, -1)
        last[r.key] = int(r.value)
    assert all(o == list(range(len(o))) for o in offsets.values())
    assert sorted(int(r.value) for r in got if r.key != b"big") == list(range(1000))


async def test_offsets_for_times_seek_and_reset(any_broker: BrokerProcess) -> None:
    from aiokafka import TopicPartition
    from aiokafka.errors import OffsetOutOfRangeError

    topic = unique_topic("aio-offsets")
    base = 1_640_000_000_000
    p = producer(any_broker.bootstrap, linger_ms=50)
    await p.start()
    try:
        await send_all(
            p, topic, [{"value": b"m%d" % i, "timestamp_ms": base + 10 * i} for i in range(12)]
        )
    finally:
        await p.stop()
    tp = TopicPartition(topic, 0)
    c = consumer(any_broker.bootstrap)
    await c.start()
    try:
        assert await c.beginning_offsets([tp]) == {tp: 0}
        assert await c.end_offsets([tp]) == {tp: 12}
        found = await c.offsets_for_times({tp: base + 65})
        assert (found[tp].offset, found[tp].timestamp) == (7, base + 70)
        assert await c.offsets_for_times({tp: base + 10_000}) == {tp: None}
        c.assign([tp])
        c.seek(tp, 7)
        got = await read(c, 5)
        assert [(r.offset, r.value) for r in got] == [(i, b"m%d" % i) for i in range(7, 12)]
        c.seek(tp, 99)  # out of range: reset to earliest
        assert [r.offset for r in await read(c, 12)] == list(range(12))
    finally:
        await c.stop()

    strict = consumer(any_broker.bootstrap, auto_offset_reset="none")
    await strict.start()
    try:
        strict.assign([tp])
        strict.seek(tp, 99)
        with pytest.raises(OffsetOutOfRangeError):
            deadline = time.monotonic() + TIMEOUT
            while time.monotonic() < deadline:
                await strict.getmany(timeout_ms=500)
    finally:
        await strict.stop()


async def test_idempotent_retries_of_lost_responses(tmp_path: Path) -> None:
    """Every 4th Produce response is cut off after the commit; retries must not duplicate."""
    from aiokafka import TopicPartition

    with broker_behind_dropping_proxy(tmp_path / "b", drop_every=4) as (b, proxy, bootstrap):
        topic = unique_topic("aio-idem-retry")
        p = producer(bootstrap, enable_idempotence=True, linger_ms=2, retry_backoff_ms=20)
        n = 800
        items = [{"key": b"%d" % (i % 3), "value": b"%d" % i} for i in range(n)]
        metas: list[Any] = []
        await p.start()
        try:
            for start in range(0, n, 40):  # many small requests
                metas += await send_all(p, topic, items[start : start + 40])
        finally:
            await p.stop()
        assert proxy.dropped >= 3, (proxy.dropped, proxy.produce_responses)
        c = consumer(bootstrap)
        await c.start()
        try:
            c.assign([TopicPartition(topic, part) for part in range(2)])
            got = await read(c, n)
        finally:
            await c.stop()
        assert sorted(int(r.value) for r in got) == list(range(n))
        assert {(m.partition, m.offset) for m in metas} == {(r.partition, r.offset) for r in got}
