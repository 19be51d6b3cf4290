"""Persisted producer snapshots (broker.producer_snapshot): a new owner knows an
idempotent producer however many segments other producers have written since its last
batch, so a later batch of its window reaching the new owner first is refused as out of
order instead of being accepted at any sequence (which would lose the batches before it:
the client takes a later batch's success as proof that they were stored).

In-process brokers over a real local-directory store and a real metadata store (the
embedded one, and a real etcd process); the client is a raw TCP connection sending
Produce requests (tests/integration/broker/test_idempotent_failures.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.meta.schema import ProducerSnapshot, producers_key
from broker.producer_rebuild import MAX_SEGMENTS
from broker.producer_snapshot import SNAPSHOT_LIMIT
from broker.server import Broker
from protocol.errors import ErrorCode
from protocol.records import build_batch
from tests.fixtures.inprocess import meta_config
from tests.integration.broker.test_ambiguous_commits import values
from tests.integration.broker.test_flush_pipeline import TOPIC
from tests.integration.broker.test_idempotent_failures import (
    Pipelined,
    UnreadableStore,
    no_snapshot_at_release,
)
from tests.integration.broker.test_producer_expiry import now_ms
from tests.integration.broker.test_producer_snapshot_faults import stored

PLAIN = MAX_SEGMENTS + 6  # one segment each: the producer's batch leaves the window


@pytest.fixture(params=["embedded", "etcd"])
def cfg(request: pytest.FixtureRequest, tmp_path: Path) -> BrokerConfig:
    # the maintenance loop never comes round by itself: the tests run its passes
    return meta_config(request, tmp_path, retention_check_interval_ms=10**9)


async def _stored(b: Broker) -> ProducerSnapshot:
    snap = await stored(b, TOPIC)  # last write times checked, then put as 0
    assert snap is not None
    return snap


async def test_a_producer_far_behind_the_newest_segments_is_known_to_the_new_owner(
    cfg: BrokerConfig,
) -> None:
    first = Broker(cfg)
    await first.start()
    no_snapshot_at_release(first)  # the snapshot maintenance wrote is what counts
    try:
        await first.topics.create(TOPIC, 1)
        conn = await Pipelined.open(first)
        assert await conn.answer(conn.send(0, "a")) == (ErrorCode.NONE, 0)  # sequences 0-1
        maintenance = first.logs.maintenance
        assert maintenance is not None
        await maintenance.run_once()
        assert await _stored(first) == ProducerSnapshot(2, ((4242, 0, ((0, 1, 0),), 0),))
        for i in range(PLAIN):  # another, plain producer: one segment per round trip
            cid = conn.send_batch(build_batch([(None, b"o%d" % i, None)]))
            assert await conn.answer(cid) == (ErrorCode.NONE, 2 + i)
        await conn.close()
        await maintenance.run_once()  # PLAIN segments since the last one: written again
        assert await _stored(first) == ProducerSnapshot(2 + PLAIN, ((4242, 0, ((0, 1, 0),), 0),))
    finally:
        await first.stop()
    node = Broker(cfg)
    await node.start()
    conn = await Pipelined.open(node)
    end = 2 + PLAIN
    try:
        # a retry of the batch it wrote first (its answer lost) is a duplicate
        assert await conn.answer(conn.send(0, "a")) == (ErrorCode.NONE, 0)
        # sequences 2-3 went astray with the old owner; 4-5 reach the new one first
        assert (await conn.answer(conn.send(4, "c")))[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert await conn.answer(conn.send(2, "b")) == (ErrorCode.NONE, end)
        assert await conn.answer(conn.send(4, "c")) == (ErrorCode.NONE, end + 2)
        assert await conn.answer(conn.send(4, "c")) == (ErrorCode.NONE, end + 2)  # a retry
        lg = await node.logs.get(TOPIC, 0)
        assert (await values(node, lg))[end:] == [b"b-0", b"b-1", b"c-0", b"c-1"]
    finally:
        await conn.close()
        await node.stop()


async def test_a_hand_off_leaves_a_snapshot_at_the_log_end(cfg: BrokerConfig) -> None:
    """The owner key's release puts the snapshot in the same transaction: the next owner
    knows the producer without reading a single segment (its reads fail here)."""
    first = Broker(cfg)
    await first.start()
    try:
        await first.topics.create(TOPIC, 1)
        conn = await Pipelined.open(first)
        assert await conn.answer(conn.send(0, "a")) == (ErrorCode.NONE, 0)
        for i in range(3):
            cid = conn.send_batch(build_batch([(None, b"o%d" % i, None)]))
            assert await conn.answer(cid) == (ErrorCode.NONE, 2 + i)
        await conn.close()
        assert first.meta is not None and await first.meta.get(producers_key(TOPIC, 0)) is None
    finally:
        await first.stop()
    node = Broker(cfg)
    await node.start()
    assert await _stored(node) == ProducerSnapshot(5, ((4242, 0, ((0, 1, 0),), 0),))
    store = UnreadableStore(node.logs.store)
    node.logs.store = store  # type: ignore[assignment]
    conn = await Pipelined.open(node)
    try:
        assert (await conn.answer(conn.send(4, "c")))[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert await conn.answer(conn.send(0, "a")) == (ErrorCode.NONE, 0)  # a duplicate
        assert store.refused == 0  # no segment was read
        store.failing = False
        assert await conn.answer(conn.send(2, "b")) == (ErrorCode.NONE, 5)
    finally:
        await conn.close()
        node.logs.store = store.inner
        await node.stop()


async def test_the_largest_snapshot_passes_through_the_metadata_store(cfg: BrokerConfig) -> None:
    """A partition with more producers than a snapshot holds: the largest snapshot
    (~0.7 MB) goes through a maintenance put and the hand-off's release transaction of
    the real store (etcd's request limit is 1.5 MiB by default), and the next owner
    restores the SNAPSHOT_LIMIT producers written last."""
    first = Broker(cfg)
    await first.start()
    many = SNAPSHOT_LIMIT + 50
    try:
        await first.topics.create(TOPIC, 1)
        conn = await Pipelined.open(first)
        assert await conn.answer(conn.send(0, "a")) == (ErrorCode.NONE, 0)  # producer 4242
        await conn.close()
        lg = await first.logs.get(TOPIC, 0)
        for pid in range(many):  # as if each had written 5 batches below the log end
            for seq in range(5):
                lg.producers.record(10**6 + pid, 0, seq, seq, 1, None, now_ms() - many + pid)
        maintenance = first.logs.maintenance
        assert maintenance is not None
        await maintenance.run_once()
        snap = await _stored(first)
        assert len(snap.producers) == SNAPSHOT_LIMIT
        assert 4242 in {p[0] for p in snap.producers}  # written last of all
    finally:
        await first.stop()  # the release puts it again
    node = Broker(cfg)
    await node.start()
    try:
        lg = await node.logs.get(TOPIC, 0)
        assert len(lg.producers) == SNAPSHOT_LIMIT
        assert lg.producers.last_write(10**6) == -1  # the 50 written first left out
        assert lg.producers.last_write(10**6 + many - 1) > 0
        assert lg.producers.check(4242, 0, 2, 2) == (ErrorCode.NONE, None)
    finally:
        await node.stop()
