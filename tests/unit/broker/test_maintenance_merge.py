"""Merges (broker/maintenance.py) on an in-process broker over a real local-directory
store and a real embedded metadata store: legacy segments, every record kept, a new
owner, age and count thresholds, a read racing a merge, a fenced merge."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from broker.partition import PartitionLog
from broker.server import Broker
from protocol.batch import iter_batches, read_header
from protocol.errors import ErrorCode
from protocol.records import build_batch, decode_batch
from segments.format import (
    SEGMENT_VERSION,
    index_key_for,
    iter_segment_batches,
    parse_object_name,
    partition_prefix,
)
from segments.store import Buffer, ObjectInfo, ObjectNotFoundError, ObjectStore
from segments.validate import validate_segment
from segments.writer import build_segment
from tests.unit.broker.loop_turns import counting_turns
from tests.unit.broker.maintenance_helpers import (
    TOPIC,
    config,
    expected,
    maint,
    manifest,
    objects,
    produce,
    read_all,
    span,
)


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


async def test_a_merge_of_partly_cached_segments_keeps_every_record_in_order(
    node: Broker,
) -> None:
    """Merges take cached segments from the cache and load only the others: with every
    other segment evicted, the merged segment still holds every batch, in offset order."""
    await produce(node.logs, 12)
    lg = await node.logs.get(TOPIC, 0)
    assert len(lg.segments) == 12
    for seg in lg.segments[::2]:
        node.logs.cache.evict(node.logs.object_key(lg, seg))
    assert [node.logs.reader.cached_data(lg, s) is None for s in lg.segments] == [
        i % 2 == 0 for i in range(12)
    ]
    await maint(node).run_once()
    assert [(s.base, s.last) for s in lg.segments] == [(0, 23)]
    node.logs.cache.clear()  # read back from the merged object itself
    assert await read_all(node.logs, lg) == expected(12)


async def test_a_merge_loads_at_most_merge_loads_segments_at_once(
    node: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A merge of evicted segments loads them ``MERGE_LOADS`` at a time, not all at once:
    each load holds a thread the flush's PUTs and commits need (docs/benchmarks.md,
    "Round 20"). Each load yields to the loop before it reads, so all the run's loads
    would be in the store together if nothing held them back."""
    from broker.merging import MERGE_LOADS

    await produce(node.logs, 12)
    lg = await node.logs.get(TOPIC, 0)
    node.logs.cache.clear()
    store = node.logs.store
    read = store.get_buffer  # type: ignore[attr-defined]  # the local store's, not all
    now = peak = 0

    async def counted(*args: object, **kwargs: object) -> Buffer:
        nonlocal now, peak
        now += 1
        peak = max(peak, now)
        try:
            for _ in range(5):  # let every other load that may start, start
                await asyncio.sleep(0)
            return await read(*args, **kwargs)
        finally:
            now -= 1

    monkeypatch.setattr(store, "get_buffer", counted)
    await maint(node).run_once()
    assert [(s.base, s.last) for s in lg.segments] == [(0, 23)]
    assert peak == MERGE_LOADS == 2
    node.logs.cache.clear()
    assert await read_all(node.logs, lg) == expected(12)


async def test_a_merged_segment_above_the_tier_floor_waits_for_as_many_newer_bytes(
    tmp_path: Path,
) -> None:
    """Size-tiered merges (broker/maintenance_policy.py, ``tier``): with 64 KiB small, a
    merged segment of 1 KiB or more is rewritten only with at least its size of newer
    segments, not with every few that come after it."""
    b = Broker(config(tmp_path, merge_small_bytes=64 * 1024))
    await b.start()
    try:
        await b.topics.create(TOPIC, 1)
        await produce(b.logs, 30)
        lg = await b.logs.get(TOPIC, 0)
        await maint(b).run_once()
        (first,) = lg.segments
        assert first.size >= 1024  # above the floor (64 KiB / 64)
        await produce(b.logs, 5, start=30)
        await maint(b).run_once()
        # the five merge among themselves: the merged one is larger than the five together
        assert [(s.base, s.last) for s in lg.segments] == [(0, 59), (60, 69)]
        assert lg.segments[0].key == first.key
        await produce(b.logs, 30, start=35)
        await maint(b).run_once()
        # the newer ones now outweigh it: it merges again, with all of them
        assert [(s.base, s.last, span(s.key)) for s in lg.segments] == [(0, 129, (0, 129))]
        assert lg.segments[0].key != first.key  # a new object, never a reused key
        assert await read_all(b.logs, lg, 7) == expected(65)[7:]
    finally:
        await b.stop()


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


async def test_a_pass_over_many_partitions_lets_the_event_loop_run(tmp_path: Path) -> None:
    """A pass over many owned partitions gives the loop a turn every ITEMS_PER_TURN
    of them and considers every one; an idle one (nothing to merge, compact or snapshot)
    is skipped without ``_maintain``; one of a compacted topic, one whose producer
    snapshot is due and one that got a new segment are looked at."""
    from broker.turns import ITEMS_PER_TURN

    b = Broker(config(tmp_path))
    await b.start()
    try:
        n = 3 * ITEMS_PER_TURN
        await b.topics.create("many", n)
        await b.topics.create("compacted", 1, {"cleanup.policy": "compact"})
        for p in range(n):
            await b.logs.get("many", p)
        await b.logs.get("compacted", 0)
        m = maint(b)
        await m.run_once()  # what new partitions do once (nothing is due after it)
        considered: list[tuple[str, int]] = []
        looked: list[tuple[str, int]] = []
        idle, maintain = m._idle, m._maintain

        def counting_idle(lg: PartitionLog, mono: float) -> bool:
            considered.append((lg.topic, lg.partition))
            return idle(lg, mono)

        async def counting(lg: PartitionLog, retention: bool, expiry: int | None) -> None:
            looked.append((lg.topic, lg.partition))
            await maintain(lg, retention, expiry)

        m._idle = counting_idle  # type: ignore[method-assign]
        m._maintain = counting  # type: ignore[method-assign]
        with counting_turns() as turns:
            await m.run_once()
        assert sorted(considered) == [("compacted", 0)] + [("many", p) for p in range(n)]
        assert looked == [("compacted", 0)]  # the compactor looks at its own each pass
        assert turns.count >= n // ITEMS_PER_TURN
        looked.clear()
        (await b.logs.get("many", 7)).snapshot_upto = -2  # its producer snapshot is due
        await m.run_once()
        assert sorted(looked) == [("compacted", 0), ("many", 7)]
        looked.clear()

        lg = await b.logs.get("many", 5)  # a new segment: a merge may be due now
        view = memoryview(bytearray(build_batch([(b"k", b"v", [])])))
        res = lg.append(read_header(view), view)
        assert res.error == ErrorCode.NONE and res.done is not None
        b.logs.appended(lg, len(view))
        await res.done
        await m.run_once()
        assert sorted(looked) == [("compacted", 0), ("many", 5)]
    finally:
        await b.stop()


async def _dear_pass(b: Broker, n: int) -> tuple[Any, list[int]]:
    """A maintenance task over ``n`` partitions, each of whose looks holds the loop half
    a turn's budget without suspending (written lately: the merger, the compactor and the
    producer snapshot look at each); and the partitions it looked at."""
    import time

    from broker.turns import TURN_BUDGET_S

    await b.topics.create("dear", n)
    for p in range(n):
        await b.logs.get("dear", p)
    m = maint(b)
    await m.run_once()
    looked: list[int] = []

    async def dear(lg: PartitionLog, retention: bool, expiry: int | None) -> None:
        looked.append(lg.partition)
        end = time.perf_counter() + TURN_BUDGET_S / 2  # held, never suspended
        while time.perf_counter() < end:
            pass

    m._idle = lambda lg, mono: False  # type: ignore[method-assign]
    m._maintain = dear  # type: ignore[method-assign]
    return m, looked


async def test_a_pass_over_dear_partitions_lets_the_loop_run_every_millisecond(
    tmp_path: Path,
) -> None:
    """Far fewer than ITEMS_PER_TURN dear partitions still get the loop a turn once
    the pass has held it TURN_BUDGET_S (broker/turns.py)."""
    from broker.turns import ITEMS_PER_TURN

    b = Broker(config(tmp_path))
    await b.start()
    try:
        n = 40
        assert n < ITEMS_PER_TURN
        m, looked = await _dear_pass(b, n)
        with counting_turns() as turns:
            await m.run_once()
        assert sorted(looked) == list(range(n))
        # n x half the budget: a turn at least every other partition, whatever the load
        assert turns.count >= n // 2 - 1
    finally:
        await b.stop()


async def test_a_pass_leaves_the_loop_idle_between_its_pieces(tmp_path: Path) -> None:
    """Work that needs many turns of the loop (a flush cycle moves a step per turn) runs
    to its end within one pause of the pass, instead of one step per piece of it
    (broker/turns.py: a turn is a pause, not sleep(0))."""
    b = Broker(config(tmp_path))
    await b.start()
    try:
        n, steps = 40, 8
        m, looked = await _dear_pass(b, n)
        done_after: list[int] = []

        async def cycle() -> None:  # a step per turn of the loop
            for _ in range(steps):
                await asyncio.sleep(0)
            done_after.append(len(looked))

        pass_ = asyncio.ensure_future(m.run_once())
        await asyncio.sleep(0)  # the pass starts its first piece
        await asyncio.gather(pass_, cycle())
        assert sorted(looked) == list(range(n))
        # two partitions a piece: with sleep(0) the cycle ended after ~2 x steps of them
        assert done_after and done_after[0] <= 3 * 2, done_after
    finally:
        await b.stop()
