"""Cold reads (issue 13): after a restart (an empty segment cache), a real client reads a
partition from its first offset out of the object store, on both backends: small
segments read whole, a segment above the whole-read limit (16 MiB) read as windows
(broker/segment_windows.py), both read ahead (broker/segment_loader.py) through a cache
smaller than the large segment (which the producer-state rebuild at the take therefore
cannot leave in the cache whole); on S3 by direct GETs (segments/s3_direct.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from segments.store import open_store
from tests.fixtures.broker import start_broker
from tests.integration.conftest import BACKENDS, TIMEOUT, backend_kwargs, create_topic, unique_topic

pytestmark = pytest.mark.integration

VALUE = 1024
BIG = 20_000  # x 1 KiB in one flush: a ~21 MB segment
SMALL = 300


def _value(i: int) -> bytes:
    return f"{i:08d}".encode().ljust(VALUE, b".")


def _produce(bootstrap: str, topic: str, first: int, n: int, acks: str) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 20,
                  "queue.buffering.max.kbytes": 1 << 20})  # fmt: skip
    errors: list[str] = []
    for i in range(first, first + n):
        p.produce(topic, _value(i), partition=0,
                  on_delivery=lambda err, _m: errors.append(str(err)) if err else None)  # fmt: skip
        p.poll(0)
    assert p.flush(TIMEOUT * 3) == 0 and not errors, errors[:3]


def _consume_all(bootstrap: str, topic: str, n: int) -> list[bytes]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_topic("cold"),
                  "enable.auto.commit": False})  # fmt: skip
    c.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    try:
        idle = 0
        while len(got) < n and idle < 30:  # 30 empty polls of 1 s: the data is not coming
            msgs = c.consume(10_000, 1.0)
            idle = 0 if msgs else idle + 1
            for m in msgs:
                assert m.error() is None, m.error()
                got.append(m.value() or b"")
    finally:
        c.close()
    return got


async def _sizes(url: str, prefix: str) -> list[int]:
    store = open_store(url)
    try:
        return [o.size for o in await store.list(prefix) if o.key.endswith(".kfs")]
    finally:
        await store.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cold_read_returns_every_message_in_order(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    kw = backend_kwargs(request, backend)
    extra = (*kw.pop("extra_args", ()), "--flush-interval-ms", "2000", "--flush-when-idle", "false",
             "--flush-bytes", str(64 << 20), "--merge-interval-ms", "0",
             "--cache-bytes", str(16 << 20), "--readahead-bytes", str(8 << 20))  # fmt: skip
    b = start_broker(tmp_path / "b", extra_args=extra, **kw)
    try:
        topic = unique_topic("cold")
        create_topic(b.bootstrap, topic, 1)
        _produce(b.bootstrap, topic, 0, SMALL, "all")  # a small segment
        _produce(b.bootstrap, topic, SMALL, BIG, "0")  # unacknowledged: one large flush
        _produce(b.bootstrap, topic, SMALL + BIG, SMALL, "all")  # after it, in order
        b.restart()  # a clean stop flushes everything; the new process has an empty cache
        total = SMALL + BIG + SMALL
        got = _consume_all(b.bootstrap, topic, total)
        assert len(got) == total
        bad = [i for i, v in enumerate(got) if v != _value(i)]
        assert not bad, f"{len(bad)} messages out of place, first at {bad[0]}"
        url = kw.get("store_url") or f"file://{tmp_path / 'b' / 'data'}"
        sizes = asyncio.run(_sizes(url, ""))
        assert max(sizes) > 16 * 1024 * 1024, sizes  # the windows were really read
    finally:
        b.stop()
