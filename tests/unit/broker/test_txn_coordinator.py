"""The transaction coordinator over a real (embedded) metadata store, without a server:
completion through the marker hand-off, takeover of a prepared transaction by another
coordinator, transactional offsets reaching the group only on commit, timeouts."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from broker.cluster import BrokerInfo
from broker.meta.base import MetaStore, MetaStoreError
from broker.meta.schema import (
    TXN_MARKERS_PREFIX,
    MarkerRequest,
    group_offset_key,
    txn_offset_key,
    txn_offsets_prefix,
    txn_state_key,
)
from broker.txn_coordinator import TxnCoordinator
from protocol.errors import ErrorCode as E
from txncoord import TxnRecord, TxnState


class OneBroker:
    """The cluster view the coordinator uses: this broker alone, lease valid."""

    def __init__(self, node_id: int) -> None:
        self.me = BrokerInfo(node_id, "127.0.0.1", 9092)

    def brokers(self) -> list[BrokerInfo]:
        return [self.me]

    def add_listener(self, cb: Callable[[], None]) -> None:
        pass

    def lease_valid(self) -> bool:
        return True


class Ids:
    def __init__(self) -> None:
        self.next = 100

    async def allocate(self) -> int:
        self.next += 1
        return self.next


@contextlib.asynccontextmanager
async def owners(meta: MetaStore, seen: list[tuple[str, MarkerRequest]]) -> AsyncIterator[None]:
    """Partition owners: acknowledge every marker request (delete it) as it appears."""

    async def run() -> None:
        async for ev in meta.watch(TXN_MARKERS_PREFIX):
            if ev.type == "put":
                seen.append((ev.key, MarkerRequest.from_json(ev.value)))
                await meta.delete(ev.key)

    task = asyncio.create_task(run())
    await asyncio.sleep(0)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def wait_state(meta: MetaStore, txn_id: str, state: TxnState) -> TxnRecord:
    """The record once it reaches ``state`` (a watch on its key; generous deadline)."""
    async with asyncio.timeout(30):
        watch = meta.watch(txn_state_key(txn_id))
        try:
            kv = await meta.get(txn_state_key(txn_id))
            if kv is not None and TxnRecord.from_json(kv.value).state == state:
                return TxnRecord.from_json(kv.value)
            async for ev in watch:
                rec = TxnRecord.from_json(ev.value)
                if rec.state == state:
                    return rec
        finally:
            await watch.aclose()
    raise AssertionError("watch ended")


def coordinator(meta: MetaStore, node: int = 1) -> TxnCoordinator:
    return TxnCoordinator(meta, OneBroker(node), Ids(), 60_000)  # type: ignore[arg-type]


async def test_commit_with_offsets_goes_through_markers(meta: MetaStore) -> None:
    c = coordinator(meta)
    seen: list[tuple[str, MarkerRequest]] = []
    async with owners(meta, seen):
        err, pid, epoch = await c.init_producer_id("tx", 10_000, -1, -1)
        assert (err, epoch) == (E.NONE, 0)
        parts = frozenset({("t", 0), ("t", 1)})
        assert await c.add_partitions("tx", pid, epoch, parts) == E.NONE
        assert await c.add_offsets("tx", pid, epoch, "g") == E.NONE
        rec = b'{"offset":7,"leader_epoch":-1,"metadata":"","commit_ts":1}'
        assert await c.txn_offset_commit("tx", pid, epoch, "g", [("t", 0, rec)]) == E.NONE
        assert await c.txn_offset_commit("tx", pid, epoch, "h", [("t", 0, rec)]) == (
            E.INVALID_TXN_STATE  # group h was never added
        )
        assert await meta.get(group_offset_key("g", "t", 0)) is None  # pending only
        assert await c.end_txn("tx", pid, epoch, True) == E.NONE
    stored = (await c.load("tx")).record
    assert stored is not None and stored.state == TxnState.COMPLETE_COMMIT
    assert sorted(k for k, _ in seen) == [
        f"{TXN_MARKERS_PREFIX}tx/t/0",
        f"{TXN_MARKERS_PREFIX}tx/t/1",
    ]
    assert all(m.commit and m.producer_id == pid for _, m in seen)
    got = await meta.get(group_offset_key("g", "t", 0))
    assert got is not None and got.value == rec
    assert await meta.get(txn_offset_key("tx", "g", "t", 0)) is None
    assert await c.end_txn("tx", pid, epoch, True) == E.NONE  # a retry
    await c.stop()


async def test_another_coordinator_completes_a_prepared_abort(meta: MetaStore) -> None:
    prepared = TxnRecord(
        producer_id=5,
        producer_epoch=3,
        timeout_ms=10_000,
        state=TxnState.PREPARE_ABORT,
        partitions=frozenset({("t", 2)}),
        groups=frozenset({"g"}),
        started_ms=1,
    )
    await meta.put(txn_state_key("tx2"), prepared.to_json())  # its coordinator died here
    pending = b'{"offset":9,"leader_epoch":-1,"metadata":"","commit_ts":1}'
    await meta.put(txn_offset_key("tx2", "g", "t", 2), pending)
    seen: list[tuple[str, MarkerRequest]] = []
    c = coordinator(meta, node=2)
    async with owners(meta, seen):
        await c.check_once()  # the completion runs in the background
        rec = await wait_state(meta, "tx2", TxnState.COMPLETE_ABORT)
    assert not rec.partitions
    assert [(k, m.commit, m.producer_epoch) for k, m in seen] == [
        (f"{TXN_MARKERS_PREFIX}tx2/t/2", False, 3)
    ]
    assert await meta.get(group_offset_key("g", "t", 2)) is None  # aborted: never visible
    assert await meta.get(txn_offset_key("tx2", "g", "t", 2)) is None
    await c.stop()


async def test_timeout_aborts_and_fences(meta: MetaStore) -> None:
    c = coordinator(meta)
    seen: list[tuple[str, MarkerRequest]] = []
    async with owners(meta, seen):
        err, pid, epoch = await c.init_producer_id("tx3", 1, -1, -1)
        assert await c.add_partitions("tx3", pid, epoch, frozenset({("t", 0)})) == E.NONE
        await asyncio.sleep(0.05)  # past its 1 ms timeout
        await c.check_once()
        rec = await wait_state(meta, "tx3", TxnState.COMPLETE_ABORT)
    assert rec.producer_epoch == epoch + 1  # the marker's epoch fences the producer
    assert seen[0][1].producer_epoch == epoch + 1 and not seen[0][1].commit
    assert await c.end_txn("tx3", pid, epoch, True) == E.PRODUCER_FENCED
    await c.stop()


async def test_stale_writer_loses_the_compare_and_set(meta: MetaStore) -> None:
    a, b = coordinator(meta, 1), coordinator(meta, 2)
    err, pid, epoch = await a.init_producer_id("tx4", 10_000, -1, -1)
    before = await a.load("tx4")
    err, pid2, epoch2 = await b.init_producer_id("tx4", 10_000, -1, -1)  # a new instance
    assert (err, pid2, epoch2) == (E.NONE, pid, epoch + 1)
    assert before.record is not None
    assert await a._save("tx4", before, before.record) is None  # noqa: SLF001
    assert await a.add_partitions("tx4", pid, epoch, frozenset({("t", 0)})) == E.PRODUCER_FENCED


async def test_running_coordinator_times_out_from_its_watch_alone(meta: MetaStore) -> None:
    """The started coordinator needs no scan: the id's state reaches it through the watch
    after its one load, its deadline wakes it, and the transaction is aborted."""
    c = coordinator(meta)
    seen: list[tuple[str, MarkerRequest]] = []
    async with owners(meta, seen):
        c.start()
        async with asyncio.timeout(30):
            await c.following.wait()
        err, pid, epoch = await c.init_producer_id("tx5", 200, -1, -1)
        assert await c.add_partitions("tx5", pid, epoch, frozenset({("t", 0)})) == E.NONE
        rec = await wait_state(meta, "tx5", TxnState.COMPLETE_ABORT)
    assert rec.producer_epoch == epoch + 1
    assert [k for k, _ in seen] == [f"{TXN_MARKERS_PREFIX}tx5/t/0"]
    assert c.stats["loads"] == 1  # no scan since: the watch brought the state
    await c.stop()


async def test_idle_transactional_id_expires(meta: MetaStore) -> None:
    """``transactional.id.expiration.ms``: an id idle that long is deleted, and its next
    InitProducerId starts afresh with a new producer id."""
    c = TxnCoordinator(meta, OneBroker(1), Ids(), 60_000, expiration_ms=300)  # type: ignore[arg-type]
    c.start()
    err, pid, epoch = await c.init_producer_id("tx6", 10_000, -1, -1)
    assert err == E.NONE
    async with asyncio.timeout(30):
        watch = meta.watch(txn_state_key("tx6"))
        try:
            if await meta.get(txn_state_key("tx6")) is not None:
                async for ev in watch:
                    if ev.type == "delete":
                        break
        finally:
            await watch.aclose()
    err, pid2, epoch2 = await c.init_producer_id("tx6", 10_000, -1, -1)
    assert (err, epoch2) == (E.NONE, 0) and pid2 != pid
    await c.stop()


class FailingOnce:
    """The store, except that the first range read under ``prefix`` fails (a store error
    in the middle of completing a transaction)."""

    def __init__(self, inner: MetaStore, prefix: str) -> None:
        self.inner, self.prefix, self.failed = inner, prefix, False

    async def range(self, prefix: str) -> Any:
        if prefix.startswith(self.prefix) and not self.failed:
            self.failed = True
            raise MetaStoreError("injected: the store failed once")
        return await self.inner.range(prefix)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_completion_the_store_failed_is_tried_again(meta: MetaStore) -> None:
    """A prepared transaction whose completion hits a store error is completed by a later
    try, with no new state change or membership change to prompt it."""
    prepared = TxnRecord(
        producer_id=6, producer_epoch=1, timeout_ms=10_000, state=TxnState.PREPARE_COMMIT,
        partitions=frozenset({("t", 0)}), started_ms=1,
    )  # fmt: skip
    await meta.put(txn_state_key("tx7"), prepared.to_json())
    flaky = FailingOnce(meta, txn_offsets_prefix("tx7"))
    c = TxnCoordinator(flaky, OneBroker(1), Ids(), 60_000)  # type: ignore[arg-type]
    seen: list[tuple[str, MarkerRequest]] = []
    async with owners(meta, seen):
        c.start()
        rec = await wait_state(meta, "tx7", TxnState.COMPLETE_COMMIT)
    assert flaky.failed and not rec.partitions
    assert [k for k, _ in seen] == [f"{TXN_MARKERS_PREFIX}tx7/t/0"]
    await c.stop()
