"""The transaction coordinator over the metadata store (docs/architecture.md,
"Transactions").

Each transactional id is coordinated by the broker it hashes to (rendezvous hashing over
the live brokers, like group coordinators). Its state is ``/txn/{tid}/state`` (a
``txncoord.TxnRecord``); every change is a compare-and-set on that key's mod revision, so
a stale coordinator's write fails and any broker can take a transactional id over.

Ending a transaction is a hand-off through the metadata store, never a broker-to-broker
call: the coordinator stores PrepareCommit/PrepareAbort, then (``_complete``, idempotent)
moves the transaction's pending offsets into the groups (commit) or drops them (abort),
puts one ``/txn-markers/{tid}/{t}/{p}`` key per partition, waits until the partitions'
owners (``broker.txn_markers``) have written the control batches and deleted those keys,
and stores CompleteCommit/CompleteAbort. Whoever coordinates the id after a crash finds
the Prepare state and runs the same steps again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from broker import faults
from broker.cluster import rendezvous
from broker.meta.base import (
    Compare,
    Delete,
    Get,
    MetaStore,
    MetaStoreError,
    Op,
    Put,
    WatchEvent,
)
from broker.meta.schema import (
    TXN_PREFIX,
    MarkerRequest,
    group_offset_key,
    txn_id_of_state_key,
    txn_marker_key,
    txn_markers_prefix,
    txn_offset_key,
    txn_offset_target,
    txn_offsets_prefix,
    txn_state_key,
)
from broker.tasks import cancel_and_wait
from broker.txn_deadlines import Deadlines, Due, due_for
from protocol.errors import ErrorCode
from txncoord import Decision, TxnRecord, TxnState, completed, machine, timed_out

if TYPE_CHECKING:
    from broker.cluster import BrokerInfo, Cluster
    from broker.handlers.registry import ProducerIdSource

log = logging.getLogger(__name__)

CAS_ATTEMPTS = 5
END_WAIT_S = 15.0  # EndTxn waits this long for the markers before answering anyway
RETRY_S = 1.0  # after a failed load or watch of the states, ask again this much later
#: ``transactional.id.expiration.ms``: an id idle this long is forgotten (Kafka: 7 days)
DEFAULT_EXPIRATION_MS = 7 * 24 * 3600 * 1000


def now_ms() -> int:
    return int(time.time() * 1000)


class Stored:
    __slots__ = ("record", "revision")

    def __init__(self, record: TxnRecord | None, revision: int) -> None:
        self.record = record
        self.revision = revision  # mod revision of the state key (0: absent)


class TxnCoordinator:
    def __init__(
        self,
        meta: MetaStore,
        cluster: Cluster,
        producer_ids: ProducerIdSource,
        max_timeout_ms: int,
        expiration_ms: int = DEFAULT_EXPIRATION_MS,
    ) -> None:
        self.meta = meta
        self.expiration_ms = expiration_ms
        # every id's state (record, mod revision), kept current by a watch (``_follow``)
        self._states: dict[str, tuple[TxnRecord, int]] = {}
        self._deadlines = Deadlines()
        self._rescan = False
        self.following = asyncio.Event()  # set once the states are loaded and watched
        self.stats = {"loads": 0}  # full loads of every id's state (start, store errors)
        self.cluster = cluster
        self.producer_ids = producer_ids
        self.max_timeout_ms = max_timeout_ms
        self._locks: dict[str, list[Any]] = {}  # id -> [lock, holders and waiters]
        self._completing: dict[str, asyncio.Task[bool]] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    # -- placement -------------------------------------------------------------------
    def coordinator_of(self, txn_id: str) -> BrokerInfo:
        return rendezvous(f"t\x00{txn_id}", self.cluster.brokers()) or self.cluster.me

    def owns(self, txn_id: str) -> bool:
        return self.coordinator_of(txn_id).node_id == self.cluster.me.node_id

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        self.cluster.add_listener(self._membership_changed)
        self._task = asyncio.create_task(self._check_loop(), name="txn-check")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._completing.values()) if t is not None]
        await cancel_and_wait(*tasks)

    # -- store -----------------------------------------------------------------------
    async def load(self, txn_id: str) -> Stored:
        kv = await self.meta.get(txn_state_key(txn_id))
        if kv is None:
            return Stored(None, 0)
        return Stored(TxnRecord.from_json(kv.value), kv.mod_revision)

    async def _save(self, txn_id: str, cur: Stored, rec: TxnRecord) -> Stored | None:
        key = txn_state_key(txn_id)
        res = await self.meta.txn(
            [Compare(key, "mod_revision", "==", cur.revision)], [Put(key, rec.to_json())]
        )
        return Stored(rec, res.revision) if res.succeeded else None

    @contextlib.asynccontextmanager
    async def _lock(self, txn_id: str) -> AsyncIterator[None]:
        """Serialise this broker's requests for one id (the store's compare-and-set
        serialises brokers); the lock is dropped once nobody holds or waits for it."""
        entry = self._locks.get(txn_id)
        if entry is None:
            entry = self._locks[txn_id] = [asyncio.Lock(), 0]
        entry[1] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                self._locks.pop(txn_id, None)

    async def _apply(self, txn_id: str, decide: object) -> tuple[Decision, Stored]:
        """Load, decide, compare-and-set; again on a conflict (another broker wrote)."""
        assert callable(decide)
        for _ in range(CAS_ATTEMPTS):
            cur = await self.load(txn_id)
            dec: Decision = decide(cur.record)
            if dec.record is None:
                return dec, cur
            rec = dec.record
            if dec.new_producer_id:
                rec = rec.with_(producer_id=await self.producer_ids.allocate())
            saved = await self._save(txn_id, cur, rec)
            if saved is not None:
                if dec.prepares:
                    self._start_completion(txn_id)
                return Decision(dec.error, rec, dec.new_producer_id), saved
        return Decision(ErrorCode.CONCURRENT_TRANSACTIONS), Stored(None, 0)

    # -- requests ---------------------------------------------------------------------
    async def init_producer_id(
        self, txn_id: str, timeout_ms: int, producer_id: int, epoch: int
    ) -> tuple[ErrorCode, int, int]:
        async with self._lock(txn_id):
            dec, stored = await self._apply(
                txn_id,
                lambda rec: machine.init_producer(
                    rec, timeout_ms, self.max_timeout_ms, producer_id, epoch, now_ms()
                ),
            )
        if dec.error != ErrorCode.NONE or dec.record is None:
            return dec.error, -1, -1
        return ErrorCode.NONE, dec.record.producer_id, dec.record.producer_epoch

    async def add_partitions(
        self, txn_id: str, producer_id: int, epoch: int, partitions: frozenset[tuple[str, int]]
    ) -> ErrorCode:
        async with self._lock(txn_id):
            dec, _ = await self._apply(
                txn_id,
                lambda rec: machine.add_partitions(rec, producer_id, epoch, partitions, now_ms()),
            )
        return dec.error

    async def add_offsets(self, txn_id: str, producer_id: int, epoch: int, group: str) -> ErrorCode:
        async with self._lock(txn_id):
            dec, _ = await self._apply(
                txn_id, lambda rec: machine.add_groups(rec, producer_id, epoch, group, now_ms())
            )
        return dec.error

    async def end_txn(self, txn_id: str, producer_id: int, epoch: int, commit: bool) -> ErrorCode:
        async with self._lock(txn_id):
            dec, _ = await self._apply(
                txn_id, lambda rec: machine.end_txn(rec, producer_id, epoch, commit, now_ms())
            )
        task = self._completing.get(txn_id)
        if dec.error == ErrorCode.NONE and dec.prepares and task is not None:
            # the decision is durable; waiting for the markers keeps the next transaction
            # from meeting CONCURRENT_TRANSACTIONS and read_committed consumers in step
            with contextlib.suppress(Exception):
                async with asyncio.timeout(END_WAIT_S):
                    await asyncio.shield(task)
        return dec.error

    async def txn_offset_commit(
        self,
        txn_id: str,
        producer_id: int,
        epoch: int,
        group: str,
        offsets: Sequence[tuple[str, int, bytes]],
    ) -> ErrorCode:
        """Store offsets pending in the transaction (visible to the group on commit).
        Guarded by the state's revision: nothing lands after the transaction ended."""
        for _ in range(CAS_ATTEMPTS):
            cur = await self.load(txn_id)
            rec = cur.record
            if rec is None or rec.producer_id != producer_id:
                return ErrorCode.INVALID_PRODUCER_ID_MAPPING
            if epoch != rec.producer_epoch:
                return ErrorCode.PRODUCER_FENCED
            if rec.state != TxnState.ONGOING or group not in rec.groups:
                return ErrorCode.INVALID_TXN_STATE
            ops: list[Op] = [Put(txn_offset_key(txn_id, group, t, p), v) for t, p, v in offsets]
            guard = Compare(txn_state_key(txn_id), "mod_revision", "==", cur.revision)
            if await self._chunked(guard, ops):
                return ErrorCode.NONE
        return ErrorCode.CONCURRENT_TRANSACTIONS

    async def list_all(self) -> list[tuple[str, TxnRecord]]:
        out = []
        for kv in await self.meta.range(TXN_PREFIX):
            tid = txn_id_of_state_key(kv.key)
            if tid is not None:
                out.append((tid, TxnRecord.from_json(kv.value)))
        return out

    # -- completion --------------------------------------------------------------------
    def _start_completion(self, txn_id: str) -> None:
        task = self._completing.get(txn_id)
        if task is not None and not task.done():
            return
        task = asyncio.create_task(self._complete(txn_id), name=f"txn-complete-{txn_id}")
        self._completing[txn_id] = task

        def done(t: asyncio.Task[bool]) -> None:
            if self._completing.get(txn_id) is t:
                self._completing.pop(txn_id, None)
            if not t.cancelled() and t.exception() is not None:
                log.warning("completing transaction %r failed: %r", txn_id, t.exception())
                # the store failed under it: try again shortly (the loop's deadline)
                retry = (now_ms() + int(RETRY_S * 1000), Due.COMPLETE)
                if self._deadlines.set(txn_id, retry):
                    self._wake.set()

        task.add_done_callback(done)

    async def _chunked(self, guard: Compare, ops: Sequence[Op]) -> bool:
        step = max(1, self.meta.max_txn_ops - 1)
        for i in range(0, len(ops), step):
            res = await self.meta.txn([guard], ops[i : i + step])
            if not res.succeeded:
                return False
        return True

    async def _complete(self, txn_id: str) -> bool:
        """Drive a prepared transaction to Complete (idempotent; see the module doc).
        Returns False when the state moved on under us (another coordinator)."""
        faults.checkpoint("txn.after_prepare")
        cur = await self.load(txn_id)
        rec = cur.record
        if rec is None or not rec.state.preparing:
            return False
        commit = rec.state == TxnState.PREPARE_COMMIT
        guard = Compare(txn_state_key(txn_id), "mod_revision", "==", cur.revision)
        ops: list[Op] = []
        for kv in await self.meta.range(txn_offsets_prefix(txn_id)):
            if commit:
                group, topic, partition = txn_offset_target(txn_id, kv.key)
                ops.append(Put(group_offset_key(group, topic, partition), kv.value))
            ops.append(Delete(kv.key))
        marker = MarkerRequest(rec.producer_id, rec.producer_epoch, commit, cur.revision)
        ops += [Put(txn_marker_key(txn_id, t, p), marker.to_json()) for t, p in rec.partitions]
        if not await self._chunked(guard, ops):
            return False
        faults.checkpoint("txn.after_markers_requested")
        await self._await_markers(txn_id)
        saved = await self._save(txn_id, cur, completed(rec, now_ms()))
        if saved is not None:
            log.info(
                "transaction %r (producer %d, epoch %d) %s on %d partitions",
                txn_id,
                rec.producer_id,
                rec.producer_epoch,
                "committed" if commit else "aborted",
                len(rec.partitions),
            )
        return saved is not None

    async def _await_markers(self, txn_id: str) -> None:
        """Wait (on a watch) until no marker request of ``txn_id`` is left."""
        prefix = txn_markers_prefix(txn_id)
        while True:
            res = await self.meta.txn([], [Get(prefix, True)])
            left = {kv.key for kv in res.gets[0]}
            if not left:
                return
            watch = self.meta.watch(prefix, start_revision=res.revision + 1)
            try:
                async for ev in watch:
                    if ev.type == "delete":
                        left.discard(ev.key)
                    else:
                        left.add(ev.key)
                    if not left:
                        return
            except MetaStoreError:
                continue  # watch again from a fresh read
            finally:
                await watch.aclose()

    # -- timeouts, expiry and takeover --------------------------------------------------
    async def _check_loop(self) -> None:
        """Follow every id's state (``_follow``); after a store error, load it all again."""
        failing = False
        while True:
            try:
                await self._follow()
            except Exception as exc:  # noqa: BLE001 - store trouble: load and watch again
                level = logging.DEBUG if failing else logging.WARNING  # once per outage
                log.log(level, "transaction check failed: %r", exc)
                failing = True
            await asyncio.sleep(RETRY_S)  # back-off before asking a failing store again

    async def _follow(self) -> None:
        """Load every id's state once, act on it, then keep it current from a watch of
        ``/txn/``: each change is looked at once (a prepared transaction this broker
        coordinates is completed, an ongoing or idle one gets its deadline), and the loop
        sleeps until the earliest deadline, a change, or a membership change (which looks
        at every id again: ids move between coordinators)."""
        revision = await self.check_once()
        watch = self.meta.watch(TXN_PREFIX, start_revision=revision + 1)
        feed = asyncio.create_task(self._consume(watch), name="txn-watch")
        self.stats["loads"] += 1
        self.following.set()  # every later change reaches ``_consume``
        try:
            while True:
                wait_s = None
                at = self._deadlines.next_ms()
                if at is not None:
                    wait_s = max(0.0, (at - now_ms()) / 1000)
                waker = asyncio.ensure_future(self._wake.wait())
                try:
                    await asyncio.wait([feed, waker], timeout=wait_s, return_when="FIRST_COMPLETED")
                finally:  # also when this loop is cancelled: no task left behind
                    waker.cancel()
                if feed.done():
                    feed.result()  # the watch failed: raise, load again
                    return
                self._wake.clear()  # the deadlines are read again at the loop's top
                if self._rescan:
                    self._rescan = False
                    for txn_id, (rec, _rev) in self._states.items():
                        self._consider(txn_id, rec)
                await self._run_due()
        finally:
            await cancel_and_wait(feed)
            await watch.aclose()

    async def _consume(self, watch: AsyncIterator[WatchEvent]) -> None:
        async for ev in watch:
            txn_id = txn_id_of_state_key(ev.key)
            if txn_id is None:
                continue
            if ev.type == "delete":
                self._states.pop(txn_id, None)
                self._deadlines.set(txn_id, None)
                continue
            rec = TxnRecord.from_json(ev.value)
            self._states[txn_id] = (rec, ev.mod_revision)
            if self._consider(txn_id, rec):
                self._wake.set()

    def _membership_changed(self) -> None:
        self._rescan = True
        self._wake.set()

    def _consider(self, txn_id: str, rec: TxnRecord) -> bool:
        """What ``rec`` (the id's current state) asks of this broker: start completing a
        prepared transaction it coordinates, else (re)set the id's deadline. True when
        that deadline is the earliest now."""
        if rec.state.preparing:
            self._deadlines.set(txn_id, None)
            if self.cluster.lease_valid() and self.owns(txn_id):
                self._start_completion(txn_id)
            return False
        return self._deadlines.set(txn_id, due_for(rec, self.expiration_ms))

    async def _run_due(self) -> None:
        for txn_id, what in self._deadlines.pop_due(now_ms()):
            if not self.cluster.lease_valid():  # cannot act now: ask again later
                self._deadlines.set(txn_id, (now_ms() + int(RETRY_S * 1000), what))
                continue
            if not self.owns(txn_id):
                continue  # its coordinator acts (a membership change looks again here)
            if what is Due.COMPLETE:
                cur = await self.load(txn_id)
                if cur.record is not None and cur.record.state.preparing:
                    self._start_completion(txn_id)
            elif what is Due.TIMEOUT:
                async with self._lock(txn_id):
                    dec, _ = await self._apply(txn_id, lambda r: _timeout(r))
                if dec.record is not None:
                    log.info("transaction %r timed out: aborting", txn_id)
            else:
                await self._expire(txn_id)

    async def _expire(self, txn_id: str) -> None:
        """Delete the state of an id idle past ``transactional.id.expiration.ms`` (a
        compare-and-set on its revision: any use since keeps it). Its next
        InitProducerId gets a new producer id, as in Kafka."""
        async with self._lock(txn_id):
            cur = await self.load(txn_id)
            rec = cur.record
            due = due_for(rec, self.expiration_ms) if rec is not None else None
            if rec is None or due is None or due[1] is not Due.EXPIRE or due[0] > now_ms():
                return
            key = txn_state_key(txn_id)
            faults.checkpoint("txn.before_expire")
            res = await self.meta.txn(
                [Compare(key, "mod_revision", "==", cur.revision)], [Delete(key)]
            )
        if res.succeeded:
            log.info("transactional id %r expired (idle since %d ms)", txn_id, rec.updated_ms)
        else:
            log.info("transactional id %r not expired: changed since it was found idle", txn_id)

    async def check_once(self) -> int:
        """Load every id's state and act on it: complete the prepared transactions this
        broker coordinates (left by a coordinator that died, or lost the id), abort the
        timed-out ones, expire the idle ones. Returns the store revision it read at."""
        res = await self.meta.txn([], [Get(TXN_PREFIX, True)])
        self._states.clear()
        self._deadlines.clear()
        for kv in res.gets[0]:
            txn_id = txn_id_of_state_key(kv.key)
            if txn_id is not None:
                rec = TxnRecord.from_json(kv.value)
                self._states[txn_id] = (rec, kv.mod_revision)
                self._consider(txn_id, rec)
        await self._run_due()
        return res.revision


def _timeout(rec: TxnRecord | None) -> Decision:
    return timed_out(rec, now_ms()) if rec is not None else Decision()
