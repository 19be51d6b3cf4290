"""A flush cycle's objects go to the store as one batch (``segments.store.put_all``; on
the local store one durability barrier, segments/local_batch.py), and each partition of
the cycle still succeeds or fails alone. In-process broker over a real local-directory
store and the real embedded metadata store, nothing wrapped."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.partition import AppendError, AppendResult, PartitionLog
from broker.server import Broker
from protocol.batch import read_header
from protocol.errors import ErrorCode
from protocol.records import RecordInput, build_batch
from segments.format import partition_prefix
from segments.names import object_name
from segments.store import batches_puts
from tests.fixtures.inprocess import local_config
from tests.integration.broker.test_flush_pipeline import values

pytestmark = pytest.mark.integration  # an in-process broker on a TCP port

TOPIC = "batched"
PARTITIONS = 12


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Broker]:
    # a long interval and no idle start: the test's appends all land in one cycle
    b = Broker(local_config(tmp_path, flush_interval_ms=60_000, flush_when_idle=False))
    await b.start()
    await b.topics.create(TOPIC, PARTITIONS)
    try:
        yield b
    finally:
        await b.stop()


def append(b: Broker, lg: PartitionLog) -> AppendResult:
    recs: list[RecordInput] = [(b"k", f"p{lg.partition}-{j}".encode(), []) for j in range(2)]
    view = memoryview(bytearray(build_batch(recs)))
    res = lg.append(read_header(view), view)
    assert res.error == ErrorCode.NONE and res.done is not None
    b.logs.appended(lg, len(view))
    return res


async def test_one_cycle_many_partitions_each_alone(node: Broker) -> None:
    """Twelve partitions flushed in one cycle: the one whose object name is already taken
    (a name only its owner writes: here planted) fails with a retriable error and gets no
    manifest entry; the other eleven are committed, in the store and readable."""
    assert batches_puts(node.logs.store)  # the instrumented local store: one batch PUT
    logs = [await node.logs.get(TOPIC, p) for p in range(PARTITIONS)]
    bad = logs[5]
    planted = partition_prefix(node.config.namespace, TOPIC, 5) + object_name(
        0, 1, bad.epoch, bad.topic_id, bad.object_seq + 1
    )
    await node.logs.store.put_if_absent(planted, [b"not a segment"])
    cycles = node.logs.flusher.stats["flush_cycles"]
    results = [append(node, lg) for lg in logs]
    node.logs.flusher._wake.set()  # noqa: SLF001 - the flush timer, without its minute
    async with asyncio.timeout(30):
        await asyncio.wait([r.done for r in results if r.done is not None])
    assert node.logs.flusher.stats["flush_cycles"] == cycles + 1  # one cycle took them all
    for lg, res in zip(logs, results, strict=True):
        assert res.done is not None
        kvs = await node.meta.range(f"/logs/{TOPIC}/{lg.partition}/segments/")
        if lg is bad:
            err = res.done.exception()
            assert isinstance(err, AppendError) and err.code == ErrorCode.KAFKA_STORAGE_ERROR
            assert kvs == [] and lg.hw == 0
            continue
        assert res.done.exception() is None
        assert [json.loads(kv.value)["base"] for kv in kvs] == [0]
        assert await values(node, lg) == [f"p{lg.partition}-{j}".encode() for j in range(2)]
        name = json.loads(kvs[0].value)["key"]
        key = partition_prefix(node.config.namespace, TOPIC, lg.partition) + name
        info = await node.logs.store.head(key)
        assert info is not None and info.etag == json.loads(kvs[0].value)["etag"]
    again = append(node, bad)  # the partition works on: a new name, committed
    node.logs.flusher._wake.set()  # noqa: SLF001
    assert again.done is not None
    async with asyncio.timeout(30):
        await again.done
    assert await values(node, bad) == [b"p5-0", b"p5-1"]
