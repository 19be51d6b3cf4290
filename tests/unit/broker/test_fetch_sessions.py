"""KIP-227 fetch sessions (issue 12): the bounded cache with Kafka's eviction rules, and
full / incremental fetches over the wire on an in-process broker (v12 by topic name,
v13+ by topic id)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.producer import ProduceRequest

from broker.fetch_sessions import (
    EVICTION_MS,
    MAX_SESSION_PARTITIONS,
    CachedPartition,
    FetchSessionCache,
)
from broker.server import Broker
from protocol.errors import ErrorCode
from protocol.records import build_batch
from tests.fixtures.inprocess import local_config
from tests.unit.broker.wire_client import WireClient

_Topic = FetchRequest.FetchTopic
_Part = _Topic.FetchPartition
_Forgotten = FetchRequest.ForgottenTopic


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _parts(n: int) -> dict[Any, CachedPartition]:
    return {("t", i): CachedPartition("t", i, 0, 1024) for i in range(n)}


def test_cache_is_bounded_and_evicts_as_kafka_does() -> None:
    clock = Clock()
    cache = FetchSessionCache(max_sessions=2, clock=clock)
    a = cache.create(_parts(5), uses_ids=False)
    b = cache.create(_parts(3), uses_ids=False)
    assert a and b and a != b
    # full, and both sessions young: no eviction, no session (id 0)
    assert cache.create(_parts(100), uses_ids=False) == 0
    # once both are older than the eviction time (touched meanwhile, so not stale), a
    # session with more partitions evicts the least valuable one (fewest partitions)
    clock.t += EVICTION_MS / 1000 + 1
    cache.touch(cache.sessions[a], cache.now_ms())
    cache.touch(cache.sessions[b], cache.now_ms())
    assert cache.create(_parts(2), uses_ids=False) == 0  # smaller than both: refused
    c = cache.create(_parts(4), uses_ids=False)
    assert c and set(cache.sessions) == {a, c} and cache.evictions == 1
    # a session unused for longer than the eviction time is evicted by anyone
    clock.t += EVICTION_MS / 1000 + 1
    cache.touch(cache.sessions[c], cache.now_ms())
    d = cache.create(_parts(1), uses_ids=False)
    assert d and set(cache.sessions) == {c, d}
    assert FetchSessionCache(max_sessions=0).create(_parts(1), uses_ids=False) == 0
    too_big = _parts(MAX_SESSION_PARTITIONS + 1)
    assert FetchSessionCache().create(too_big, uses_ids=False) == 0


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    b = Broker(local_config(tmp_path))
    await b.start()
    await b.topics.create("s", 3)
    try:
        yield b
    finally:
        await b.stop()


async def _produce(c: WireClient, partition: int, n: int) -> None:
    batch = build_batch([(b"k", b"v%d" % i, []) for i in range(n)])
    req = ProduceRequest(
        transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[("s", [(partition, batch)])]
    )
    resp = await c.call(req, 9)
    assert resp.responses[0].partition_responses[0].error_code == 0


def _fetch(version: int, tid: uuid.UUID, offsets: dict[int, int], sid: int, epoch: int,
           forget: list[int] | None = None) -> Any:  # fmt: skip
    by_id = version >= 13
    parts = [
        _Part(partition=p, fetch_offset=o, partition_max_bytes=1 << 20, log_start_offset=-1)
        for p, o in offsets.items()
    ]
    topics = [_Topic(topic=None if by_id else "s", topic_id=tid, partitions=parts)] if parts else []
    forgotten = (
        [_Forgotten(topic=None if by_id else "s", topic_id=tid, partitions=forget)]
        if forget
        else []
    )
    return FetchRequest(
        replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 24, isolation_level=0,
        session_id=sid, session_epoch=epoch, topics=topics, forgotten_topics_data=forgotten,
        rack_id="",
    )  # fmt: skip


def _answered(resp: Any) -> dict[int, tuple[int, int, int]]:
    """partition -> (error, high watermark, record bytes)"""
    return {
        p.partition_index: (p.error_code, p.high_watermark, len(p.records or b""))
        for t in resp.responses
        for p in t.partitions
    }


@pytest.mark.parametrize("version", [12, 16])
async def test_incremental_fetches_carry_only_changes(broker: Broker, version: int) -> None:
    c = await WireClient.connect(broker.port)
    try:
        tid = broker.topics.get("s").topic_id  # type: ignore[union-attr]
        await _produce(c, 0, 3)
        full = await c.call(_fetch(version, tid, {0: 0, 1: 0, 2: 0}, 0, 0), version)
        sid = full.session_id
        assert full.error_code == 0 and sid != 0
        got = _answered(full)
        assert set(got) == {0, 1, 2} and got[0][1] == 3 and got[0][2] > 0
        # nothing changed: an empty incremental response
        inc = await c.call(_fetch(version, tid, {0: 3}, sid, 1), version)
        assert (inc.error_code, inc.session_id, _answered(inc)) == (0, sid, {})
        # new records on partition 2: only it is answered (its offset comes from the session)
        await _produce(c, 2, 2)
        inc = await c.call(_fetch(version, tid, {}, sid, 2), version)
        got = _answered(inc)
        assert set(got) == {2} and got[2][1] == 2 and got[2][2] > 0
        # forgetting partition 2: new data there is no longer answered
        await _produce(c, 2, 1)
        inc = await c.call(_fetch(version, tid, {}, sid, 3, forget=[2]), version)
        assert _answered(inc) == {}
        # a stale epoch, then an unknown session: Kafka's errors, no partitions
        bad = await c.call(_fetch(version, tid, {}, sid, 3), version)
        assert bad.error_code == ErrorCode.INVALID_FETCH_SESSION_EPOCH and not bad.responses
        gone = await c.call(_fetch(version, tid, {}, sid ^ 0x5A5A, 1), version)
        assert gone.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
        # the right epoch still works; a final (-1) fetch closes the session
        ok = await c.call(_fetch(version, tid, {}, sid, 4), version)
        assert ok.error_code == 0 and ok.session_id == sid
        final = await c.call(_fetch(version, tid, {0: 0}, sid, -1), version)
        assert final.session_id == 0 and set(_answered(final)) == {0}
        assert sid not in broker.fetch_sessions.sessions
        after = await c.call(_fetch(version, tid, {}, sid, 5), version)
        assert after.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    finally:
        await c.close()


async def test_names_and_ids_do_not_mix_in_a_session(broker: Broker) -> None:
    c = await WireClient.connect(broker.port)
    try:
        tid = broker.topics.get("s").topic_id  # type: ignore[union-attr]
        full = await c.call(_fetch(12, tid, {0: 0}, 0, 0), 12)
        mixed = await c.call(_fetch(13, tid, {}, full.session_id, 1), 13)
        assert mixed.error_code == ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR
    finally:
        await c.close()


async def test_long_poll_wakes_on_a_partition_left_unread(broker: Broker) -> None:
    """Unchanged partitions of a session are not read, only waited on: new records on one
    of them end the long poll, and the response carries them."""
    c = await WireClient.connect(broker.port)
    writer = await WireClient.connect(broker.port)
    try:
        tid = broker.topics.get("s").topic_id  # type: ignore[union-attr]
        for p in range(3):
            await _produce(writer, p, 1)
        full = await c.call(_fetch(16, tid, {0: 0, 1: 0, 2: 0}, 0, 0), 16)
        sid = full.session_id
        inc = await c.call(_fetch(16, tid, {0: 1, 1: 1, 2: 1}, sid, 1), 16)
        assert _answered(inc) == {}  # positions moved to the end: nothing new
        poll = _fetch(16, tid, {}, sid, 2)
        poll.max_wait_ms, poll.min_bytes = 25_000, 1
        waiting = asyncio.ensure_future(c.call(poll, 16))
        idle = broker.logs.logs[("s", 1)]
        deadline = asyncio.get_running_loop().time() + 30
        while not idle.waiters:  # the poll waits on partition 1 without having read it
            assert asyncio.get_running_loop().time() < deadline and not waiting.done()
            await asyncio.sleep(0.01)
        await _produce(writer, 1, 2)
        got = _answered(await waiting)
        assert set(got) == {1} and got[1][1] == 3 and got[1][2] > 0
    finally:
        await c.close()
        await writer.close()
