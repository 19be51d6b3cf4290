"""Partition owners write the commit and abort markers the coordinators request
(docs/architecture.md, "Transactions").

A coordinator puts ``/txn-markers/{tid}/{t}/{p}`` (a ``MarkerRequest``) for every
partition of a transaction it has prepared. Every broker watches that prefix and, for
each partition it owns (rendezvous hash), appends a control batch (the producer id, the
marker's epoch, one record: key = version 0 + type 0 abort / 1 commit, value = version 0
+ coordinator epoch) through the normal write path, waits for its commit, then in one
metadata transaction under its owner guard deletes the request and the partition's open
transaction and, for an abort, adds the aborted-transaction entry. A request for a
producer with no open transaction here (nothing was produced, or the marker was already
written by a previous owner) is only deleted. Requests are looked for again on every
membership change and every ``RESCAN_S``, so a partition taken over by another broker
gets its pending markers from the new owner. The same scan drops aborted-transaction
entries that retention or DeleteRecords left wholly below the log start.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import struct
from typing import TYPE_CHECKING

from broker import faults
from broker.meta.base import Compare, Delete, KeyValue, MetaStore, MetaStoreError, Op, Put
from broker.meta.schema import (
    TXN_MARKERS_PREFIX,
    AbortedTxn,
    MarkerRequest,
    aborted_txn_key,
    open_txn_key,
    owner_key,
    txn_marker_target,
)
from broker.partition import AppendError, PartitionLog
from broker.tasks import cancel_and_wait
from broker.txn_partition import loaded_state, state_of
from protocol.batch import read_header
from protocol.errors import ErrorCode, KafkaProtocolError
from protocol.records import build_batch

if TYPE_CHECKING:
    from broker.cluster import Cluster
    from broker.logs import LogManager

log = logging.getLogger(__name__)

RESCAN_S = 2.0
_KEY = struct.Struct(">hh")  # version, type
_VALUE = struct.Struct(">hi")  # version, coordinator epoch


def control_batch(req: MarkerRequest) -> bytes:
    key = _KEY.pack(0, 1 if req.commit else 0)
    value = _VALUE.pack(0, req.coordinator_epoch & 0x7FFFFFFF)
    return build_batch(
        [(key, value, None)],
        producer_id=req.producer_id,
        producer_epoch=req.producer_epoch,
        transactional=True,
        control=True,
    )


class MarkerWriter:
    def __init__(self, meta: MetaStore, logs: LogManager, cluster: Cluster) -> None:
        self.meta = meta
        self.logs = logs
        self.cluster = cluster
        self._wake = asyncio.Event()
        self._busy: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self.cluster.add_listener(self._wake.set)
        for coro in (self._watch(), self._loop()):
            task = asyncio.create_task(coro, name="txn-markers")
            self._tasks.add(task)

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks)

    async def _watch(self) -> None:
        while True:
            watch = self.meta.watch(TXN_MARKERS_PREFIX)
            try:
                async for ev in watch:
                    if ev.type == "put":
                        self._wake.set()
            except MetaStoreError:
                self._wake.set()  # rescan, then watch again
            finally:
                await watch.aclose()
            await asyncio.sleep(0.5)  # back-off before re-watching a failing store

    async def _loop(self) -> None:
        failing = False
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RESCAN_S):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.scan_once()
                failing = False
            except Exception as exc:  # noqa: BLE001 - store trouble: next round
                # once per outage at WARNING, then quietly until a scan succeeds
                log.log(
                    logging.DEBUG if failing else logging.WARNING, "marker scan failed: %r", exc
                )
                failing = True

    async def scan_once(self) -> None:
        if not self.cluster.lease_valid():
            return
        await self.prune_aborted()
        for kv in await self.meta.range(TXN_MARKERS_PREFIX):
            target = txn_marker_target(kv.key)
            if target is None or kv.key in self._busy:
                continue
            _, topic, partition = target
            if self.topic_gone(topic, partition):
                await self.meta.delete(kv.key)
                continue
            if not self.cluster.owns_partition(topic, partition):
                continue
            self._busy.add(kv.key)
            task = asyncio.create_task(self._write(kv, topic, partition))
            self._tasks.add(task)
            task.add_done_callback(functools.partial(self._done, key=kv.key))

    async def prune_aborted(self) -> None:
        """Drop aborted-transaction entries wholly below a partition's log start
        (retention or DeleteRecords removed every record they cover)."""
        for lg in list(self.logs.logs.values()):
            st = loaded_state(lg)
            if st is None or not st.aborted or st.aborted[0][0] >= lg.log_start:
                continue
            gone = [last for last, _pid, _first in st.aborted if last < lg.log_start]
            ops: list[Op] = [Delete(aborted_txn_key(lg.topic, lg.partition, x)) for x in gone]
            guard = Compare(owner_key(lg.topic, lg.partition), "value", "==", lg.owner_value)
            step = max(1, self.meta.max_txn_ops - 1)
            for i in range(0, len(ops), step):
                if not (await self.meta.txn([guard], ops[i : i + step])).succeeded:
                    break
            else:
                st.forget_below(lg.log_start)

    def topic_gone(self, topic: str, partition: int) -> bool:
        info = self.logs.topics.get(topic)
        return info is None or not 0 <= partition < info.partitions

    def _done(self, task: asyncio.Task[None], key: str) -> None:
        self._tasks.discard(task)
        self._busy.discard(key)
        if not task.cancelled() and task.exception() is not None:
            log.warning("writing marker %s failed: %r", key, task.exception())

    async def _write(self, kv: KeyValue, topic: str, partition: int) -> None:
        try:
            lg = await self.logs.get(topic, partition)
        except KafkaProtocolError:
            return  # not (or no longer) ours: its owner writes it
        code = await self.write(lg, MarkerRequest.from_json(kv.value), kv.key)
        if code == ErrorCode.NOT_LEADER_OR_FOLLOWER:
            log.info("marker for %s-%d left to the new owner", topic, partition)

    async def write(
        self, lg: PartitionLog, req: MarkerRequest, request_key: str | None = None
    ) -> ErrorCode:
        """Write ``req``'s marker to ``lg`` (the module doc); ``request_key``, the
        coordinator's request, is deleted with it (None: a WriteTxnMarkers request).
        INVALID_PRODUCER_EPOCH when the producer's open transaction is newer than the
        marker, NOT_LEADER_OR_FOLLOWER when the partition moved away meanwhile; a failed
        append raises AppendError (retriable)."""
        topic, partition = lg.topic, lg.partition
        st = await state_of(self.meta, lg)
        async with st.lock:
            current = st.open.get(req.producer_id)
            guard = Compare(owner_key(topic, partition), "value", "==", lg.owner_value)
            if current is not None and current.producer_epoch > req.producer_epoch:
                # a request older than the producer's open transaction: never write it
                if request_key is not None:
                    await self.meta.txn([guard], [Delete(request_key)])
                return ErrorCode.INVALID_PRODUCER_EPOCH
            if current is not None:
                offset = await self._append_marker(lg, req)
                st.open.pop(req.producer_id, None)
                entry = None if req.commit else AbortedTxn(req.producer_id, current.first, offset)
                if entry is not None:
                    st.add_aborted(entry)
                st.closed[req.producer_id] = entry
                lg.wake_waiters()  # the last stable offset moved
            st.fenced[req.producer_id] = max(st.fenced.get(req.producer_id, -1), req.producer_epoch)
            ops: list[Op] = [Delete(open_txn_key(topic, partition, req.producer_id))]
            if request_key is not None:
                ops.append(Delete(request_key))
            entry = st.closed.get(req.producer_id)
            if entry is not None and not req.commit:
                ops.append(Put(aborted_txn_key(topic, partition, entry.last), entry.to_json()))
            res = await self.meta.txn([guard], ops)
            return ErrorCode.NONE if res.succeeded else ErrorCode.NOT_LEADER_OR_FOLLOWER

    async def _append_marker(self, lg: PartitionLog, req: MarkerRequest) -> int:
        view = memoryview(bytearray(control_batch(req)))
        res = lg.append(read_header(view), view)
        if res.error != ErrorCode.NONE or res.done is None:
            raise AppendError(res.error)
        self.logs.appended(lg, len(view))
        faults.checkpoint("txn.before_marker_commit")
        await res.done  # raises AppendError when the flush failed: retried next scan
        return res.base_offset
