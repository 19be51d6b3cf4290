"""Log maintenance (broker/maintenance.py): merge planning, retention policy, and merges,
retention, DeleteRecords and sweeps on an in-process broker over a real local-directory
store and a real embedded metadata store."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from broker.config import BrokerConfig
from broker.logs import LogManager
from broker.maintenance import Maintenance
from broker.maintenance_policy import plan_merges, retention_victims
from broker.partition import PartitionLog, SegmentMeta
from broker.server import Broker
from protocol.batch import iter_batches, read_header
from protocol.errors import ErrorCode, KafkaProtocolError
from protocol.records import build_batch, decode_batch
from segments.format import (
    SEGMENT_VERSION,
    build_segment,
    index_key_for,
    iter_segment_batches,
    object_name,
    parse_object_name,
    partition_prefix,
)
from segments.store import Buffer, ObjectInfo, ObjectNotFoundError, ObjectStore, open_store
from segments.validate import validate_segment
from tests.fixtures.inprocess import local_config

TOPIC = "maint"


def seg(base: int, last: int, size: int = 100, max_ts: int = 0) -> SegmentMeta:
    return SegmentMeta(base, last, size, last - base + 1, max_ts, f"e{base}")


# ------------------------------------------------------------------- pure policy


def test_plan_merges_cuts_runs_at_big_ineligible_gaps_and_limits() -> None:
    segs = [seg(0, 0), seg(1, 1), seg(2, 2), seg(3, 9, size=5000), seg(10, 10), seg(11, 11)]
    segs += [seg(13, 13), seg(14, 14), seg(15, 15)]  # a gap at 12
    runs = plan_merges(segs, lambda s: True, 1000, 10_000, 2, 100)
    assert [[s.base for s in r] for r in runs] == [[0, 1, 2], [10, 11], [13, 14, 15]]
    # min_count
    runs = plan_merges(segs, lambda s: True, 1000, 10_000, 3, 100)
    assert [[s.base for s in r] for r in runs] == [[0, 1, 2], [13, 14, 15]]
    # max_count and max_bytes split runs
    runs = plan_merges(segs[:3], lambda s: True, 1000, 10_000, 2, 2)
    assert [[s.base for s in r] for r in runs] == [[0, 1]]
    runs = plan_merges(segs[:3], lambda s: True, 1000, 250, 1, 100)
    assert [[s.base for s in r] for r in runs] == [[0, 1]]
    # eligibility (age) stops a run
    runs = plan_merges(segs, lambda s: s.base < 11, 1000, 10_000, 2, 100)
    assert [[s.base for s in r] for r in runs] == [[0, 1, 2]]


def test_retention_victims_by_time_and_bytes_never_the_last() -> None:
    segs = [seg(0, 9, 100, max_ts=1000), seg(10, 19, 100, 2000), seg(20, 29, 100, 3000)]
    assert retention_victims(segs, 10_000, -1, -1) == 0
    assert retention_victims(segs, 10_000, 100, -1) == 2  # all old, but never the last
    assert retention_victims(segs, 3_500, 1_000, -1) == 2  # max_ts < 2500: first two
    assert retention_victims(segs, 2_500, 1_000, -1) == 1
    assert retention_victims(segs, 10_000, -1, 200) == 1  # 300 -> 200
    assert retention_victims(segs, 10_000, -1, 150) == 1  # dropping a 2nd leaves 100 < 150
    assert retention_victims(segs, 10_000, -1, 0) == 2
    # time stops at the first young segment even if later ones are older
    mixed = [seg(0, 9, max_ts=5000), seg(10, 19, max_ts=1), seg(20, 29, max_ts=1)]
    assert retention_victims(mixed, 6000, 2000, -1) == 0
    # unknown timestamps (-1) never expire by time
    assert retention_victims([seg(0, 0, max_ts=-1), seg(1, 1)], 10**12, 1, -1) == 0


def test_object_names() -> None:
    import uuid

    tid = uuid.UUID("0123456789abcdef0123456789abcdef")
    name = object_name(5, 17, 3, tid, 42)
    assert (
        name
        == "segment-00000000000000000005-00000000000000000017-e0000000003-01234567-000000000042.kfs"
    )
    parsed = parse_object_name(name)
    assert parsed is not None
    assert (parsed.base, parsed.last, parsed.epoch, parsed.topic_tag, parsed.seq) == (
        5,
        17,
        3,
        "01234567",
        42,
    )
    assert parse_object_name(name[:-4] + ".index") == replace(parsed, index=True)
    # the legacy names are still read
    legacy = parse_object_name("segment-00000000000000000005-00000000000000000017.index")
    assert legacy is not None and (legacy.base, legacy.last, legacy.epoch) == (5, 17, None)
    plain = parse_object_name("segment-00000000000000000042.kfs")
    assert plain is not None and (plain.base, plain.last, plain.epoch) == (42, None, None)
    assert parse_object_name("segment-42.kfs") is None
    assert parse_object_name("notes.txt") is None
    assert parse_object_name(name.replace("-e0", "-x0")) is None


def span(key: str) -> tuple[int, int | None]:
    """(base, last) of an object name."""
    parsed = parse_object_name(key)
    assert parsed is not None, key
    return parsed.base, parsed.last


# ------------------------------------------------------------------- in-process broker


def config(tmp: Path, **kw: Any) -> BrokerConfig:
    defaults: dict[str, Any] = {
        "merge_interval_ms": 3_600_000,  # the loop stays idle: tests drive run_once
        "retention_check_interval_ms": 3_600_000,
        "merge_min_age_ms": 0,
        "merge_min_segments": 2,
        "segment_delete_grace_ms": 0,
    }
    return local_config(tmp, **{**defaults, **kw})


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Broker]:
    b = Broker(config(tmp_path))
    await b.start()
    await b.topics.create(TOPIC, 1)
    try:
        yield b
    finally:
        await b.stop()


def maint(b: Broker) -> Maintenance:
    assert b.logs.maintenance is not None
    return b.logs.maintenance


async def produce(logs: LogManager, n: int, ts: int | None = None, start: int = 0) -> None:
    """``n`` batches of two records, each committed (one segment each) before the next."""
    lg = await logs.get(TOPIC, 0)
    now = int(time.time() * 1000)
    for i in range(start, start + n):
        recs: list[Any] = [(f"k{i}".encode(), f"value-{i}-{j}".encode() * 3, []) for j in range(2)]
        view = memoryview(bytearray(build_batch(recs, timestamps=[ts or now] * 2)))
        res = lg.append(read_header(view), view)
        assert res.error == ErrorCode.NONE and res.done is not None
        logs.appended(lg, len(view))
        await res.done


async def read_all(logs: LogManager, lg: PartitionLog, start: int = 0) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    offset = start
    while offset < lg.hw:
        views = await logs.read(lg, offset, 1 << 20)
        assert views, f"nothing read at {offset}"
        for v in views:
            for _hdr, bv in iter_batches(v):
                for r in decode_batch(bv)[1]:
                    if r.offset >= offset:
                        assert r.value is not None
                        out.append((r.offset, r.value))
        offset = out[-1][0] + 1
    return out


def expected(n: int, start: int = 0) -> list[tuple[int, bytes]]:
    return [
        (2 * i + j, f"value-{i}-{j}".encode() * 3)
        for i in range(start, start + n)
        for j in range(2)
    ]


async def manifest(b: Broker) -> list[dict[str, object]]:
    kvs = await b.meta.range(f"/logs/{TOPIC}/0/segments/")
    return [json.loads(kv.value) for kv in kvs]


async def end_value(b: Broker) -> dict[str, int]:
    kv = await b.meta.get(f"/logs/{TOPIC}/0/end")
    assert kv is not None
    return dict(json.loads(kv.value))


def objects(tmp: Path) -> set[str]:
    d = tmp / "data" / partition_prefix("default", TOPIC, 0)
    return set(os.listdir(d)) if d.exists() else set()


async def test_legacy_segments_with_index_objects_are_read_merged_and_deleted(
    node: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Segments an older broker wrote (version 1, the index a separate object beside each)
    stay readable, merge into one version 2 object, and lose their index objects too."""
    import functools

    import broker.flush

    legacy = functools.partial(build_segment, version=1)
    monkeypatch.setattr(broker.flush, "build_segment", legacy)
    await produce(node.logs, 6)
    monkeypatch.undo()
    lg = await node.logs.get(TOPIC, 0)
    store = node.logs.store
    for s in lg.segments:  # the index objects the older broker wrote beside them
        key = node.logs.object_key(lg, s)
        data = await store.get(key)
        assert data[4:6] == b"\0\1"  # version 1
        views = [v for _p, _h, v in iter_segment_batches(data)]
        await store.put_if_absent(index_key_for(key), [legacy(s.base, views).index])
    assert len(objects(tmp_path)) == 12
    node.logs.cache.clear()
    assert await read_all(node.logs, lg) == expected(6)
    await produce(node.logs, 2, start=6)  # new ones beside them: one object each
    assert len(objects(tmp_path)) == 14
    # the ranged read path (segments too big to read whole: index, then ranged GETs)
    import broker.reads

    monkeypatch.setattr(broker.reads, "WHOLE_READ_LIMIT", 0)
    node.logs.cache.clear()
    assert await read_all(node.logs, lg) == expected(8)  # both layouts
    monkeypatch.undo()
    await maint(node).run_once()
    await maint(node).flush_deletes()
    (merged,) = lg.segments
    assert objects(tmp_path) == {merged.key}  # old segments and old index objects gone
    node.logs.cache.clear()
    assert await read_all(node.logs, lg) == expected(8)
    monkeypatch.setattr(broker.reads, "WHOLE_READ_LIMIT", 0)
    node.logs.cache.clear()
    assert await read_all(node.logs, lg, 7) == expected(8)[7:]  # from inside the merged one


async def test_merge_replaces_small_segments_and_keeps_every_record(
    node: Broker, tmp_path: Path
) -> None:
    await produce(node.logs, 30)
    lg = await node.logs.get(TOPIC, 0)
    assert len(lg.segments) == 30 and len(await manifest(node)) == 30
    await maint(node).run_once()
    assert [(s.base, s.last) for s in lg.segments] == [(0, 59)]
    entries = await manifest(node)
    name = str(entries[0]["key"])
    assert len(entries) == 1 and span(name) == (0, 59)
    parsed = parse_object_name(name)
    assert parsed is not None and parsed.epoch == lg.epoch  # the writer's epoch is in it
    assert entries[0]["records"] == 60 and entries[0]["last"] == 59
    assert await read_all(node.logs, lg) == expected(30)
    await maint(node).flush_deletes()
    assert objects(tmp_path) == {name}  # one object: its index travels inside
    data = tmp_path / "data" / partition_prefix("default", TOPIC, 0) / name
    report = validate_segment(data.read_bytes())
    assert report.ok and len(report.batches) == 30
    assert report.header is not None and report.header.version == SEGMENT_VERSION
    assert report.index is not None and report.index[0].offset == 0
    # later small segments merge again, with the earlier merged one (still small)
    await produce(node.logs, 5, start=30)
    await maint(node).run_once()
    assert [(s.base, s.last, span(s.key)) for s in lg.segments] == [(0, 69, (0, 69))]
    assert lg.segments[0].key != name  # a new object, never a reused key
    assert await read_all(node.logs, lg, 7) == expected(35)[7:]


async def test_merged_manifest_survives_a_new_owner(tmp_path: Path) -> None:
    b = Broker(config(tmp_path))
    await b.start()
    await b.topics.create(TOPIC, 1)
    await produce(b.logs, 12)
    await maint(b).run_once()
    await maint(b).flush_deletes()
    await b.stop()
    b2 = Broker(config(tmp_path))
    await b2.start()
    try:
        lg = await b2.logs.get(TOPIC, 0)
        assert [span(s.key) for s in lg.segments] == [(0, 23)]
        b2.logs.cache.clear()
        assert await read_all(b2.logs, lg) == expected(12)
        await produce(b2.logs, 2, start=12)
        assert await read_all(b2.logs, lg) == expected(14)
    finally:
        await b2.stop()


async def test_merge_respects_min_age_and_min_segments(tmp_path: Path) -> None:
    b = Broker(config(tmp_path, merge_min_age_ms=3_600_000))
    await b.start()
    try:
        await b.topics.create(TOPIC, 1)
        await produce(b.logs, 6)
        await maint(b).run_once()
        lg = await b.logs.get(TOPIC, 0)
        assert len(lg.segments) == 6  # too young
    finally:
        await b.stop()
    b = Broker(config(tmp_path, merge_min_segments=10))
    await b.start()
    try:
        await maint(b).run_once()
        lg = await b.logs.get(TOPIC, 0)
        assert len(lg.segments) == 6  # a run of 6 < 10
    finally:
        await b.stop()


class PausingStore:
    """The real local store, with the next GET of one key held until released (to place a
    merge and a deletion between a read's lookup and its GET)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.hold_key = ""
        self.reached = asyncio.Event()
        self.release = asyncio.Event()

    async def get(
        self,
        key: str,
        start: int | None = None,
        end: int | None = None,
        if_match: str | None = None,
    ) -> bytes:
        if key == self.hold_key:
            self.hold_key = ""
            self.reached.set()
            await self.release.wait()
        return await self.inner.get(key, start, end, if_match)

    async def put_if_absent(
        self, key: str, data: Sequence[Buffer], *, crc32c: int | None = None
    ) -> str:
        return await self.inner.put_if_absent(key, data, crc32c=crc32c)

    async def head(self, key: str) -> ObjectInfo | None:
        return await self.inner.head(key)

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    async def list(self, prefix: str) -> list[ObjectInfo]:
        return await self.inner.list(prefix)

    async def close(self) -> None:
        await self.inner.close()


async def test_read_that_loses_its_segment_to_a_merge_retries(node: Broker) -> None:
    await produce(node.logs, 8)
    lg = await node.logs.get(TOPIC, 0)
    pausing = PausingStore(node.logs.store)
    node.logs.store = pausing
    node.logs.cache.clear()
    pausing.hold_key = node.logs.object_key(lg, lg.segments[3])
    assert lg.segments[3].base == 6
    reader = asyncio.create_task(node.logs.read(lg, 6, 1 << 20))
    await pausing.reached.wait()  # the read resolved segment 6 and waits on its GET
    await maint(node).run_once()
    await maint(node).flush_deletes()  # segment-...06.kfs is gone now
    pausing.release.set()
    views = await reader
    got = [
        (r.offset, r.value)
        for v in views
        for _h, bv in iter_batches(v)
        for r in decode_batch(bv)[1]
    ]
    assert [o for o, _ in got if o >= 6] == list(range(6, 16))
    # a segment that is gone while the manifest still names it is an error, not a loop
    node.logs.cache.clear()
    (merged,) = lg.segments
    await node.logs.store.delete(node.logs.object_key(lg, merged))
    with pytest.raises(ObjectNotFoundError):
        await node.logs.read(lg, 0, 1 << 20)


async def test_fenced_merge_commits_nothing_and_deletes_nothing(
    node: Broker, tmp_path: Path
) -> None:
    await produce(node.logs, 5)
    lg = await node.logs.get(TOPIC, 0)
    before = list(lg.segments)
    names = objects(tmp_path)
    await node.meta.put(f"/owners/{TOPIC}/0", b'{"broker":9,"epoch":99}')  # another owner
    assert await maint(node).merge_partition(lg) == 0
    assert len(await manifest(node)) == 5 and lg.segments == before
    assert lg.state == "closed" and node.logs.logs.get((TOPIC, 0)) is None  # dropped
    # a fenced broker deletes nothing: its merged object stays for the next owner's sweep
    after = objects(tmp_path)
    assert names < after
    assert [span(n) for n in after - names if n.endswith(".kfs")] == [(0, 9)]


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


async def test_new_owner_sweeps_only_what_no_writer_can_still_commit(tmp_path: Path) -> None:
    b = Broker(config(tmp_path))
    await b.start()
    await b.topics.create(TOPIC, 1)
    await produce(b.logs, 4)
    old = await b.logs.get(TOPIC, 0)
    tid = old.topic_id
    await b.stop()
    prefix = partition_prefix("default", TOPIC, 0)
    store = open_store(f"file://{tmp_path}/data")
    gone = {
        "segment-00000000000000000000-00000000000000000005.kfs",  # legacy merge, unreferenced
        "segment-00000000000000000001.kfs",  # legacy plain
        object_name(0, 5, old.epoch, tid, 99),  # the previous owner's uncommitted merge
    }
    kept = {
        object_name(8, 9, old.epoch + 1, tid, 1),  # the new owner's own (outcome unknown)
        object_name(8, 9, old.epoch + 5, tid, 1),  # a newer owner's
        "notes.txt",
    }
    for name in gone | kept:
        await store.put_if_absent(prefix + name, [b"x"])
    await store.close()
    b2 = Broker(config(tmp_path, merge_interval_ms=0))
    await b2.start()
    try:
        lg = await b2.logs.get(TOPIC, 0)
        assert lg.epoch == old.epoch + 1
        await maint(b2).run_once()  # grace 0: the sweep is due at once
        names = objects(tmp_path)
        assert not gone & names
        assert kept <= names
        assert {s.key for s in lg.segments} <= names
        assert await read_all(b2.logs, lg) == expected(4)
    finally:
        await b2.stop()


async def test_sweep_spares_objects_younger_than_the_grace(tmp_path: Path) -> None:
    """Age counts from the object's own creation time, not from when a sweeper saw it."""
    b = Broker(config(tmp_path))
    await b.start()
    await b.topics.create(TOPIC, 1)
    await produce(b.logs, 2)
    await b.stop()
    prefix = partition_prefix("default", TOPIC, 0)
    store = open_store(f"file://{tmp_path}/data")
    young, aged = "segment-00000000000000000007.kfs", "segment-00000000000000000009.kfs"
    for name in (young, aged):
        await store.put_if_absent(prefix + name, [b"x"])
    await store.close()
    path = tmp_path / "data" / prefix / aged
    os.utime(path, (time.time() - 7200, time.time() - 7200))
    b2 = Broker(config(tmp_path, merge_interval_ms=0, segment_delete_grace_ms=3_600_000))
    await b2.start()
    try:
        lg = await b2.logs.get(TOPIC, 0)
        assert await maint(b2).sweep(lg) == 1
        names = objects(tmp_path)
        assert young in names and aged not in names
    finally:
        await b2.stop()


async def test_a_fenced_sweeper_deletes_nothing(tmp_path: Path) -> None:
    b = Broker(config(tmp_path))
    await b.start()
    try:
        await b.topics.create(TOPIC, 1)
        await produce(b.logs, 2)
        lg = await b.logs.get(TOPIC, 0)
        prefix = partition_prefix("default", TOPIC, 0)
        stray = object_name(0, 1, lg.epoch - 1 if lg.epoch > 1 else 0, lg.topic_id, 5)
        await b.store.put_if_absent(prefix + stray, [b"x"])
        await b.meta.put(f"/owners/{TOPIC}/0", b'{"broker":9,"epoch":99}')  # taken over
        assert await maint(b).sweep(lg) == 0
        assert stray in objects(tmp_path) and lg.state == "closed"
    finally:
        await b.stop()


async def test_pending_deletions_spare_a_recreated_topic(tmp_path: Path) -> None:
    b = Broker(config(tmp_path, segment_delete_grace_ms=3_600_000))
    await b.start()
    try:
        await b.topics.create(TOPIC, 1)
        await produce(b.logs, 4)
        first = (await b.logs.get(TOPIC, 0)).segments[0].key
        await maint(b).run_once()  # the merged-away objects wait for deletion
        assert any(k.endswith(first) for k in maint(b).pending_deletes)
        await b.topics.delete(TOPIC)
        await b.topics.wait_background()
        await b.topics.create(TOPIC, 1)
        await produce(b.logs, 1)  # the new topic's first segment, at base 0 again
        await maint(b).flush_deletes()
        lg = await b.logs.get(TOPIC, 0)
        assert lg.segments[0].key in objects(tmp_path)
        assert await read_all(b.logs, lg) == expected(1)
    finally:
        await b.stop()


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
