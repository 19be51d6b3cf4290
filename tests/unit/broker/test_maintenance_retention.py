"""Retention and DeleteRecords (broker/maintenance.py) on an in-process broker over a real
local-directory store and a real embedded metadata store: by bytes and time, from the
loop, inside a segment, the log start across owners, the handler at every version."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from broker.server import Broker
from protocol.errors import ErrorCode, KafkaProtocolError
from tests.unit.broker.maintenance_helpers import (
    TOPIC,
    config,
    end_value,
    expected,
    maint,
    manifest,
    objects,
    produce,
    read_all,
    span,
)


async def test_retention_by_bytes_and_time(node: Broker, tmp_path: Path) -> None:
    await produce(node.logs, 10)
    lg = await node.logs.get(TOPIC, 0)
    first = lg.segments[0].key
    size = lg.segments[0].size
    await node.topics.alter_configs(TOPIC, {"retention.bytes": str(4 * size)})
    assert await maint(node).apply_retention(lg) == 6
    assert lg.log_start == 12 and [s.base for s in lg.segments] == [12, 14, 16, 18]
    assert (await end_value(node))["log_start"] == 12
    assert [int(str(e["base"])) for e in await manifest(node)] == [12, 14, 16, 18]
    assert await read_all(node.logs, lg, 12) == expected(10)[12:]
    await maint(node).flush_deletes()
    assert first not in objects(tmp_path) and lg.segments[0].key in objects(tmp_path)
    # by time: everything is old, but the last segment stays
    await node.topics.alter_configs(TOPIC, {"retention.bytes": "-1", "retention.ms": "1000"})
    later = int(time.time() * 1000) + 60_000
    assert await maint(node).apply_retention(lg) == 0  # not old yet
    assert await maint(node).apply_retention(lg, now_ms=later) == 3
    assert [s.base for s in lg.segments] == [18] and lg.log_start == 18
    assert await maint(node).apply_retention(lg, now_ms=later) == 0


async def test_retention_runs_from_the_loop(tmp_path: Path) -> None:
    b = Broker(config(tmp_path, retention_check_interval_ms=50, merge_interval_ms=0))
    await b.start()
    try:
        await b.topics.create(TOPIC, 1, {"retention.ms": "1"})
        await produce(b.logs, 3, ts=1_000)
        lg = await b.logs.get(TOPIC, 0)
        watch = b.meta.watch(f"/logs/{TOPIC}/0/end", start_revision=1)
        try:
            async with asyncio.timeout(10):
                async for ev in watch:  # the loop's retention commit rewrites the end key
                    if json.loads(ev.value).get("log_start") == 4:
                        break
        finally:
            await watch.aclose()
        assert lg.log_start == 4 and [s.base for s in lg.segments] == [4]
    finally:
        await b.stop()


async def test_delete_records_inside_a_segment_and_to_the_end(node: Broker, tmp_path: Path) -> None:
    await produce(node.logs, 6)
    lg = await node.logs.get(TOPIC, 0)
    await maint(node).run_once()
    assert [(s.base, s.last) for s in lg.segments] == [(0, 11)]
    assert await maint(node).delete_records(lg, 5) == 5
    assert lg.log_start == 5 and len(lg.segments) == 1
    assert (await end_value(node))["log_start"] == 5
    assert await maint(node).delete_records(lg, 3) == 5  # below the log start: no change
    with pytest.raises(KafkaProtocolError) as err:
        await maint(node).delete_records(lg, lg.hw + 1)
    assert err.value.code == ErrorCode.OFFSET_OUT_OF_RANGE
    await produce(node.logs, 2, start=6)  # segments [12..13], [14..15]
    assert await maint(node).delete_records(lg, 13) == 13
    assert [s.base for s in lg.segments] == [12, 14]
    assert await maint(node).delete_records(lg, -1) == 16
    assert lg.segments == [] and lg.log_start == 16 and await manifest(node) == []
    await produce(node.logs, 1, start=8)
    assert await read_all(node.logs, lg, 16) == expected(9)[16:]
    await maint(node).flush_deletes()
    names = objects(tmp_path)
    (last,) = lg.segments
    assert names == {last.key} and span(last.key) == (16, 17)


async def test_log_start_survives_a_new_owner(tmp_path: Path) -> None:
    b = Broker(config(tmp_path))
    await b.start()
    await b.topics.create(TOPIC, 1)
    await produce(b.logs, 3)
    lg = await b.logs.get(TOPIC, 0)
    assert await maint(b).delete_records(lg, 3) == 3
    await produce(b.logs, 1, start=3)  # a flush commit keeps log_start in the end key
    assert (await end_value(b)) == {"next_offset": 8, "epoch": lg.epoch, "log_start": 3}
    await b.stop()
    b2 = Broker(config(tmp_path))
    await b2.start()
    try:
        lg2 = await b2.logs.get(TOPIC, 0)
        assert lg2.log_start == 3 and lg2.hw == 8
        assert (await end_value(b2))["log_start"] == 3
    finally:
        await b2.stop()


@pytest.mark.parametrize("version", [0, 1, 2])
async def test_delete_records_handler_every_version(node: Broker, version: int) -> None:
    from kafka.protocol.admin import DeleteRecordsRequest

    from broker.handlers.delete_records import delete_records as handle
    from broker.handlers.registry import RequestContext
    from protocol.codec import decode_request, response_class
    from protocol.frame import RequestHeader

    await produce(node.logs, 3)
    req = DeleteRecordsRequest(
        topics=[(TOPIC, [(0, 4), (7, 1)]), ("nope", [(0, 1)])], timeout_ms=1000
    )
    body = memoryview(bytes(req.encode(version=version)))
    ctx = RequestContext(broker=node, header=RequestHeader(21, version, 1, "t", 0))
    resp = await handle(ctx, decode_request(21, version, body))
    raw = bytes(resp.encode(version=version))
    out = response_class(21).decode(raw, version=version)
    got = {
        (t.name, p.partition_index): (p.error_code, p.low_watermark)
        for t in out.topics
        for p in t.partitions
    }
    unknown = int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    assert got == {(TOPIC, 0): (0, 4), (TOPIC, 7): (unknown, -1), ("nope", 0): (unknown, -1)}
    lg = await node.logs.get(TOPIC, 0)
    assert lg.log_start == 4 and [s.base for s in lg.segments] == [4]
    req = DeleteRecordsRequest(topics=[(TOPIC, [(0, 99)])], timeout_ms=1000)
    body = memoryview(bytes(req.encode(version=version)))
    resp = await handle(ctx, decode_request(21, version, body))
    (t,) = resp.topics
    assert t.partitions[0].error_code == int(ErrorCode.OFFSET_OUT_OF_RANGE)
