"""Pipelined flush cycles (broker/logs.py): the next cycle uploads while the previous one
is still uploading or committing, but commits stay in offset order, and a cycle that
follows a failed one never commits past the gap. In-process broker over a real
local-directory store and the real embedded metadata store; the store is wrapped only to
hold (or fail) one chosen PUT."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from broker.partition import AppendError, AppendResult, PartitionLog
from broker.server import Broker
from protocol.batch import iter_batches, read_header
from protocol.errors import ErrorCode
from protocol.records import RecordInput, build_batch, decode_batch
from segments.format import parse_object_name
from segments.store import Buffer, ObjectStore, StoreError
from tests.fixtures.inprocess import local_config

pytestmark = pytest.mark.integration  # an in-process broker on a TCP port

TOPIC = "pipe"


def segment_base(key: str) -> int | None:
    """The base offset of a segment object's key (None for indexes and anything else)."""
    name = parse_object_name(key.rsplit("/", 1)[-1])
    return None if name is None or name.index else name.base


class GatedStore:
    """The real store; a PUT of the segment at base ``held`` waits for ``release`` (then
    fails if ``fail``)."""

    def __init__(self, inner: ObjectStore, held: int | None, fail: bool) -> None:
        self.inner = inner
        self.held = held
        self.fail = fail
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.written: dict[int, asyncio.Event] = {}

    def written_event(self, base: int) -> asyncio.Event:
        return self.written.setdefault(base, asyncio.Event())

    async def put_if_absent(
        self, key: str, data: Sequence[Buffer], *, crc32c: int | None = None
    ) -> str:
        base = segment_base(key)
        if base is not None and base == self.held:
            self.entered.set()
            await self.release.wait()
            if self.fail:
                raise StoreError(f"injected failure writing {key}")
        etag = await self.inner.put_if_absent(key, data, crc32c=crc32c)
        if base is not None:
            self.written_event(base).set()
        return etag

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Broker]:
    cfg = local_config(tmp_path)
    b = Broker(cfg)
    await b.start()
    await b.topics.create(TOPIC, 1)
    try:
        yield b
    finally:
        b.logs.store = getattr(b.logs.store, "inner", b.logs.store)
        await b.stop()


def gate(b: Broker, base: int, fail: bool = False) -> GatedStore:
    store = GatedStore(b.logs.store, base, fail)
    b.logs.store = store  # type: ignore[assignment]
    return store


def append(b: Broker, lg: PartitionLog, tag: str) -> AppendResult:
    recs: list[RecordInput] = [(tag.encode(), f"{tag}-{j}".encode(), []) for j in range(2)]
    view = memoryview(bytearray(build_batch(recs)))
    res = lg.append(read_header(view), view)
    assert res.error == ErrorCode.NONE and res.done is not None
    b.logs.appended(lg, len(view))
    return res


async def manifest_bases(b: Broker) -> list[int]:
    kvs = await b.meta.range(f"/logs/{TOPIC}/0/segments/")
    return [int(json.loads(kv.value)["base"]) for kv in kvs]


async def values(b: Broker, lg: PartitionLog) -> list[bytes]:
    out: list[bytes] = []
    for view in await b.logs.read(lg, 0, 1 << 20):
        for _hdr, bv in iter_batches(view):
            out += [r.value for r in decode_batch(bv)[1] if r.value is not None]
    return out


async def test_next_cycle_uploads_meanwhile_but_commits_after(node: Broker) -> None:
    store = gate(node, 0)
    lg = await node.logs.get(TOPIC, 0)
    a = append(node, lg, "a")
    await store.entered.wait()  # cycle 1 is stuck in its segment PUT
    b = append(node, lg, "b")
    assert b.base_offset == 2
    async with asyncio.timeout(10):  # the next cycle uploads while the first is held
        await store.written_event(2).wait()
    await asyncio.sleep(0.05)  # give a wrongly ordered commit the chance to happen
    assert a.done is not None and b.done is not None
    assert not b.done.done() and lg.hw == 0 and await manifest_bases(node) == []
    store.release.set()
    await asyncio.gather(a.done, b.done)
    assert lg.hw == 4 and await manifest_bases(node) == [0, 2]
    assert await values(node, lg) == [b"a-0", b"a-1", b"b-0", b"b-1"]


async def test_cycle_after_a_failed_one_fails_instead_of_leaving_a_gap(node: Broker) -> None:
    store = gate(node, 0, fail=True)
    lg = await node.logs.get(TOPIC, 0)
    a = append(node, lg, "a")
    await store.entered.wait()
    b = append(node, lg, "b")
    async with asyncio.timeout(10):  # the next cycle uploads while the first is held
        await store.written_event(2).wait()
    store.release.set()
    for res in (a, b):
        assert res.done is not None
        with pytest.raises(AppendError) as err:
            await res.done
        assert err.value.code == ErrorCode.KAFKA_STORAGE_ERROR
    assert lg.hw == 0 and lg.next_offset == 0 and await manifest_bases(node) == []
    # the log goes on from the committed end; b's uncommitted object at base 2 is gone
    # (its writer knew it was never committed), and new objects get new names
    assert not [k for k in await node.store.list("default/") if segment_base(k.key) == 2]
    store.held = None
    c = append(node, lg, "c")
    assert c.base_offset == 0 and c.done is not None
    await c.done
    d = append(node, lg, "d")
    assert d.base_offset == 2 and d.done is not None
    await d.done
    assert lg.hw == 4 and await manifest_bases(node) == [0, 2]
    assert await values(node, lg) == [b"c-0", b"c-1", b"d-0", b"d-1"]


async def test_an_idle_flusher_starts_at_once_a_busy_one_batches(tmp_path: Path) -> None:
    """No cycle in flight: an append is flushed at once, not after the flush interval
    (here 60 s); while a cycle is in flight, the next append waits (batched), and when
    that cycle ends the flusher is idle again and starts its cycle at once."""
    b = Broker(local_config(tmp_path, flush_interval_ms=60_000))
    await b.start()
    try:
        await b.topics.create(TOPIC, 1)
        lg = await b.logs.get(TOPIC, 0)
        store = gate(b, 2)  # the second segment's PUT is held
        a = append(b, lg, "a")
        async with asyncio.timeout(20):  # far less than the interval
            assert a.done is not None
            await a.done
            await b.logs.flusher.idle()  # its cycle task has ended too
        first = append(b, lg, "b")  # idle again: its cycle starts at once
        async with asyncio.timeout(20):
            await store.entered.wait()
        later = append(b, lg, "c")  # a cycle is in flight: batched, not started
        for _ in range(20):  # many loop passes: a cycle started at once would have begun
            await asyncio.sleep(0)
        assert len(b.logs.flusher._cycles) == 1 and lg.pending  # noqa: SLF001
        assert first.done is not None and later.done is not None
        assert not later.done.done()
        store.release.set()
        async with asyncio.timeout(20):  # far less than the interval
            await first.done
            await later.done  # the cycle in flight ended: idle, so c's started at once
        assert lg.hw == 6 and await manifest_bases(b) == [0, 2, 4]
    finally:
        b.logs.store = getattr(b.logs.store, "inner", b.logs.store)
        await b.stop()


async def test_flush_when_idle_false_batches_by_time_only(tmp_path: Path) -> None:
    """``--flush-when-idle false``: an idle broker's append waits out the flush interval
    (here 60 s) like any other, so it is still pending after the flusher ran; the
    flushes of stop and hand-off still take it."""
    b = Broker(local_config(tmp_path, flush_interval_ms=60_000, flush_when_idle=False))
    await b.start()
    try:
        await b.topics.create(TOPIC, 1)
        lg = await b.logs.get(TOPIC, 0)
        a = append(b, lg, "a")
        for _ in range(20):  # many loop passes: a cycle started at once would have begun
            await asyncio.sleep(0)
        assert not b.logs.flusher._cycles and lg.pending and lg.hw == 0  # noqa: SLF001
        async with asyncio.timeout(20):
            await b.logs.flush([lg])
        assert a.done is not None and a.done.done() and lg.hw == 2
        assert await manifest_bases(b) == [0]
    finally:
        await b.stop()


async def test_a_cycle_that_dies_waits_for_the_one_before_it(node: Broker) -> None:
    """A cycle that dies of an unexpected error while the previous one is still in its
    PUT fails only its own batches, after the previous one committed: the log rewinds to
    the right end, and an idempotent producer's retry continues where it left off."""
    store = gate(node, 0)  # cycle 1's PUT waits, then succeeds
    lg = await node.logs.get(TOPIC, 0)
    a = append_seq(node, lg, 0)
    await store.entered.wait()
    flusher = node.logs.flusher
    upload_all = flusher._upload_all  # noqa: SLF001

    async def dies(jobs: Any) -> Any:
        flusher._upload_all = upload_all  # type: ignore[method-assign]  # noqa: SLF001
        raise RuntimeError("injected: a bug in the cycle")

    flusher._upload_all = dies  # type: ignore[method-assign]  # noqa: SLF001
    b = append_seq(node, lg, 2)
    async with asyncio.timeout(30):
        while flusher._upload_all is dies:  # noqa: SLF001  # cycle 2 started and died
            await asyncio.sleep(0.01)
    store.release.set()
    assert a.done is not None and b.done is not None
    await a.done
    with pytest.raises(AppendError):
        await b.done
    assert lg.hw == 2 and lg.next_offset == 2
    retry = append_seq(node, lg, 2)
    assert retry.base_offset == 2 and retry.done is not None
    await retry.done
    assert await manifest_bases(node) == [0, 2]


def append_seq(b: Broker, lg: PartitionLog, seq: int) -> AppendResult:
    """Two records of idempotent producer 77 from sequence ``seq``."""
    recs: list[RecordInput] = [(None, b"s%d" % (seq + j), []) for j in range(2)]
    view = memoryview(
        bytearray(build_batch(recs, producer_id=77, producer_epoch=0, base_sequence=seq))
    )
    res = lg.append(read_header(view), view)
    assert res.error == ErrorCode.NONE and res.done is not None, res
    b.logs.appended(lg, len(view))
    return res
