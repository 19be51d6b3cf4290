"""The partition logs this broker owns: acquisition, group commit, reads (DESIGN §4, §6, §7).

Write path: handlers append to a ``PartitionLog`` (offsets assigned in memory); a single
flusher task runs *flush cycles*: when any partition's buffer reaches ``flush_bytes`` or
the oldest buffered batch is ``flush_interval_ms`` old, it takes every partition's buffer,
writes each as a segment + index object with a conditional PUT (bounded concurrency),
then commits ONE metadata transaction for the cycle (chunked at the store's op limit)
that checks each partition's owner key and end-key revision and appends the manifest
entry and the new log end. Only then are the appends acknowledged.

Ownership: the owner of a partition holds ``/owners/{t}/{p}`` under this broker's lease
with an epoch that increases on every change of owner; every commit compares it, so a
broker that lost ownership can never commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from broker.meta.base import Compare, Delete, KeyValue, MetaStore, MetaStoreError, Put
from broker.partition import (
    ACTIVE,
    CLOSED,
    RELEASING,
    AppendError,
    PartitionLog,
    PendingBatch,
    SegmentMeta,
)
from protocol.batch import iter_batches
from protocol.errors import ErrorCode, KafkaProtocolError
from segments.cache import CachedSegment, SegmentCache
from segments.format import (
    build_segment,
    index_key,
    index_key_for,
    parse_index,
    partition_prefix,
    segment_key,
)
from segments.reader import read_from, slice_batches
from segments.store import (
    ObjectExistsError,
    ObjectNotFoundError,
    ObjectStore,
    PreconditionFailedError,
    StoreError,
)

if TYPE_CHECKING:
    from broker.cluster import Cluster
    from broker.config import BrokerConfig
    from broker.maintenance import Maintenance
    from broker.topics import TopicManager

log = logging.getLogger(__name__)

WHOLE_READ_LIMIT = 16 * 1024 * 1024  # segments up to this size are read (and cached) whole
ACQUIRE_WAIT_S = 5.0
MAX_CYCLES_IN_FLIGHT = 2
JOIN_OFF_LOOP_BYTES = 1 << 20


def _end_key(topic: str, partition: int) -> str:
    return f"/logs/{topic}/{partition}/end"


def _owner_key(topic: str, partition: int) -> str:
    return f"/owners/{topic}/{partition}"


def _seg_entry_key(topic: str, partition: int, base: int) -> str:
    return f"/logs/{topic}/{partition}/segments/{base:020d}"


def end_json(next_offset: int, epoch: int, log_start: int) -> bytes:
    """The value of ``/logs/{t}/{p}/end`` (``log_start``: docs/format.md, log start)."""
    return json.dumps(
        {"next_offset": next_offset, "epoch": epoch, "log_start": log_start},
        separators=(",", ":"),
    ).encode()


def _epoch_key(topic: str, partition: int, epoch: int) -> str:
    return f"/logs/{topic}/{partition}/epochs/{epoch:010d}"


class LogManager:
    def __init__(
        self,
        config: BrokerConfig,
        meta: MetaStore,
        store: ObjectStore,
        cluster: Cluster,
        topics: TopicManager,
    ) -> None:
        self.config = config
        self.meta = meta
        self.store = store
        self.cluster = cluster
        self.topics = topics
        self.cache = SegmentCache(config.cache_bytes)
        self.logs: dict[tuple[str, int], PartitionLog] = {}
        self._acquiring: dict[tuple[str, int], asyncio.Task[PartitionLog]] = {}
        self._dirty: set[PartitionLog] = set()
        self._wake = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._releases: set[asyncio.Task[None]] = set()
        # flush cycles in flight: the next one uploads while the last one commits
        self._cycles: list[asyncio.Task[None]] = []
        self.stats = {"flush_cycles": 0, "segments": 0, "segment_bytes": 0, "txns": 0}
        # serializes manifest transactions of one partition set: flush commits and the
        # maintenance ones (merge, retention, DeleteRecords) compare the same end revision
        self.commit_lock = asyncio.Lock()
        self.maintenance: Maintenance | None = None

    async def start(self) -> None:
        from broker.maintenance import Maintenance

        self.maintenance = Maintenance(self)
        self.maintenance.start()
        self._flusher = asyncio.create_task(self._flush_loop(), name="flusher")
        self.cluster.add_listener(self._on_membership)
        self.cluster.on_lease_lost(self._drop_all)
        self.topics.add_listener(self._on_topic)

    async def stop(self) -> None:
        """Flush what is buffered, release every partition, stop the flusher."""
        if self.maintenance is not None:
            await self.maintenance.stop()
        for lg in list(self.logs.values()):
            lg.state = RELEASING
        await self.flush_all()
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        for lg in list(self.logs.values()):
            await self._release_key(lg)
        self.logs.clear()

    @property
    def pending_bytes(self) -> int:
        """Bytes appended on this broker and not yet committed."""
        return sum(lg.pending_bytes for lg in self.logs.values())

    # -- ownership ----------------------------------------------------------------------
    def local(self, topic: str, partition: int) -> PartitionLog | None:
        lg = self.logs.get((topic, partition))
        return lg if lg is not None and lg.state == ACTIVE else None

    def high_watermark(self, topic: str, partition: int) -> int:
        lg = self.logs.get((topic, partition))
        return lg.hw if lg is not None else -1

    async def get(self, topic: str, partition: int) -> PartitionLog:
        """The local log of (topic, partition), acquiring ownership if this broker is the
        partition's owner. Raises KafkaProtocolError(NOT_LEADER_OR_FOLLOWER, ...)."""
        lg = self.logs.get((topic, partition))
        if lg is not None and lg.state == ACTIVE:
            return lg
        info = self.topics.get(topic)
        if info is None or not 0 <= partition < info.partitions:
            raise KafkaProtocolError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        if lg is not None or not self.cluster.owns_partition(topic, partition):
            raise KafkaProtocolError(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        tp = (topic, partition)
        task = self._acquiring.get(tp)
        if task is None:
            task = asyncio.create_task(self._acquire(topic, partition, info.topic_id))
            self._acquiring[tp] = task
            task.add_done_callback(lambda _t: self._acquiring.pop(tp, None))
        return await asyncio.shield(task)

    async def _acquire(self, topic: str, partition: int, topic_id: object) -> PartitionLog:
        okey, ekey = _owner_key(topic, partition), _end_key(topic, partition)
        deadline = asyncio.get_running_loop().time() + ACQUIRE_WAIT_S
        while True:
            owner = await self.meta.get(okey)
            end = await self.meta.get(ekey)
            if owner is not None and not self._is_mine_stale(owner):
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    raise KafkaProtocolError(ErrorCode.NOT_LEADER_OR_FOLLOWER)
                await self._wait_deleted(okey, owner.mod_revision, remaining)
                continue
            lg = await self._take(topic, partition, topic_id, owner, end)
            if lg is not None:
                return lg

    def _is_mine_stale(self, owner: KeyValue) -> bool:
        """An owner key left by a previous incarnation of this node id."""
        try:
            d = json.loads(owner.value)
        except ValueError:
            return False
        return int(d.get("broker", -1)) == self.config.node_id and owner.lease != (
            self.cluster.lease_id
        )

    async def _take(
        self,
        topic: str,
        partition: int,
        topic_id: object,
        owner: KeyValue | None,
        end: KeyValue | None,
    ) -> PartitionLog | None:
        okey, ekey = _owner_key(topic, partition), _end_key(topic, partition)
        next_offset, epoch, log_start = 0, 0, 0
        if end is not None:
            d = json.loads(end.value)
            next_offset, epoch = int(d["next_offset"]), int(d["epoch"])
            log_start = int(d.get("log_start", 0))
        epoch += 1
        owner_value = json.dumps({"broker": self.config.node_id, "epoch": epoch}).encode()
        compares = [
            Compare(okey, "value", "==", owner.value)
            if owner is not None
            else Compare(okey, "create_revision", "==", 0),
            Compare(ekey, "mod_revision", "==", end.mod_revision if end else 0),
        ]
        end_value = end_json(next_offset, epoch, log_start)
        res = await self.meta.txn(
            compares,
            [
                Put(okey, owner_value, self.cluster.lease_id),
                Put(ekey, end_value),
                Put(_epoch_key(topic, partition, epoch), str(next_offset).encode()),
            ],
        )
        if not res.succeeded:
            return None
        segs = [
            SegmentMeta.from_json(int(kv.key.rsplit("/", 1)[-1]), kv.value)
            for kv in await self.meta.range(f"/logs/{topic}/{partition}/segments/")
        ]
        epochs = [
            (int(kv.key.rsplit("/", 1)[-1]), int(kv.value))
            for kv in await self.meta.range(f"/logs/{topic}/{partition}/epochs/")
        ]
        import uuid

        tid = topic_id if isinstance(topic_id, uuid.UUID) else uuid.UUID(int=0)
        lg = PartitionLog(
            topic,
            partition,
            tid,
            epoch,
            owner_value,
            res.revision,
            next_offset,
            segs,
            epochs,
            log_start,
        )
        await self._rebuild_producers(lg)
        self.logs[(topic, partition)] = lg
        if self.maintenance is not None:
            self.maintenance.acquired(lg)
        log.info(
            "took ownership of %s-%d at epoch %d (log end %d, %d segments)",
            topic,
            partition,
            epoch,
            next_offset,
            len(segs),
        )
        return lg

    async def _wait_deleted(self, key: str, revision: int, timeout: float) -> None:
        watch = self.meta.watch(key, start_revision=revision + 1)
        try:
            async with asyncio.timeout(timeout):
                async for ev in watch:
                    if ev.type == "delete":
                        return
        except TimeoutError:
            return
        finally:
            await watch.aclose()  # type: ignore[attr-defined]

    async def _rebuild_producers(self, lg: PartitionLog, max_segments: int = 4) -> None:
        """Idempotent-producer state from the batch headers of the newest segments."""
        from segments.format import iter_segment_batches

        for seg in lg.segments[-max_segments:]:
            try:
                data = await self._segment_data(lg, seg)
            except (StoreError, ValueError) as exc:
                log.warning("producer state rebuild skipped a segment: %s", exc)
                continue
            for _pos, hdr, _view in iter_segment_batches(data):
                if hdr.producer_id >= 0 and hdr.base_sequence >= 0:
                    from broker.partition import last_sequence

                    lg.producers.record(
                        hdr.producer_id,
                        hdr.producer_epoch,
                        hdr.base_sequence,
                        last_sequence(hdr.base_sequence, hdr.last_offset_delta),
                        hdr.base_offset,
                        None,
                    )

    def _on_membership(self) -> None:
        for (topic, partition), lg in list(self.logs.items()):
            if lg.state == ACTIVE and not self.cluster.owns_partition(topic, partition):
                task = asyncio.create_task(self._hand_off(lg))
                self._releases.add(task)
                task.add_done_callback(self._releases.discard)

    async def _hand_off(self, lg: PartitionLog) -> None:
        lg.state = RELEASING
        await self.flush([lg])
        await self._release_key(lg)
        self.logs.pop((lg.topic, lg.partition), None)
        lg.close(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        log.info("handed off %s-%d", lg.topic, lg.partition)

    async def _release_key(self, lg: PartitionLog) -> None:
        okey = _owner_key(lg.topic, lg.partition)
        with contextlib.suppress(MetaStoreError):
            await self.meta.txn([Compare(okey, "value", "==", lg.owner_value)], [Delete(okey)])

    def _drop_all(self) -> None:
        for lg in list(self.logs.values()):
            lg.close(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        self.logs.clear()

    def _on_topic(self, name: str, info: object) -> None:
        for (topic, partition), lg in list(self.logs.items()):
            if topic == name and (info is None or lg.topic_id != getattr(info, "topic_id", None)):
                self.logs.pop((topic, partition), None)
                lg.close(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        if info is None:
            self.cache.evict_prefix(f"{self.config.namespace}/{name}/")

    # -- write path ---------------------------------------------------------------------
    def appended(self, lg: PartitionLog, nbytes: int) -> None:
        """Tell the flusher ``lg`` has new data (called after PartitionLog.append)."""
        self._dirty.add(lg)
        if lg.pending_bytes >= self.config.flush_bytes:
            self._wake.set()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(
                self.config.flush_interval_ms / 1000, self._fire
            )

    def _fire(self) -> None:
        self._timer = None
        self._wake.set()

    async def flush_all(self) -> None:
        """Flush every owned partition (shutdown)."""
        await self.flush(list(self.logs.values()))

    async def flush(self, logs: list[PartitionLog]) -> None:
        """Run flush cycles until ``logs`` have nothing buffered or in flight (hand-off,
        shutdown). Appends to them must already be stopped (state RELEASING)."""
        while True:
            waits: list[asyncio.Future[None]] = [lg.pending[-1].future for lg in logs if lg.pending]
            waits += [lg.flushing for lg in logs if lg.flushing is not None]
            if not waits:
                return
            self._dirty.update(lg for lg in logs if lg.pending)
            self._wake.set()
            await asyncio.wait(waits)

    async def _flush_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            ready = [lg for lg in self._dirty if lg.pending]
            self._dirty.clear()
            if ready:
                self._start_cycle(ready)
                if len(self._cycles) >= MAX_CYCLES_IN_FLIGHT:
                    await asyncio.wait([self._cycles[0]])
            if self._dirty and self._timer is None and not self._wake.is_set():
                oldest = min(lg.pending_since for lg in self._dirty if lg.pending)
                delay = oldest + self.config.flush_interval_ms / 1000
                delay -= asyncio.get_running_loop().time()
                if delay <= 0:
                    self._wake.set()
                else:
                    self._timer = asyncio.get_running_loop().call_later(delay, self._fire)

    def _start_cycle(self, ready: list[PartitionLog]) -> None:
        """Take the buffers of ``ready`` now and flush them in a task of their own; its
        commit waits for the previous cycle's (manifest entries stay in offset order)."""
        prev = self._cycles[-1] if self._cycles else None
        jobs = [(lg, lg.take_pending()) for lg in ready]
        task = asyncio.create_task(self._run_cycle(jobs, prev), name="flush-cycle")
        self._cycles.append(task)
        task.add_done_callback(self._cycles.remove)

    async def _run_cycle(
        self,
        jobs: list[tuple[PartitionLog, list[PendingBatch]]],
        prev: asyncio.Task[None] | None,
    ) -> None:
        try:
            await self._flush_cycle(jobs, prev)
        except Exception:  # never let a failed cycle go unlogged
            log.exception("flush cycle failed")

    async def _flush_cycle(
        self,
        jobs: list[tuple[PartitionLog, list[PendingBatch]]],
        prev: asyncio.Task[None] | None = None,
    ) -> None:
        loop = asyncio.get_running_loop()
        flushing: list[asyncio.Future[None]] = []
        for lg, _pend in jobs:
            lg.flushing = loop.create_future()
            flushing.append(lg.flushing)
        try:
            sem = asyncio.Semaphore(self.config.flush_concurrency)
            uploads = await asyncio.gather(
                *(self._upload(sem, lg, pend) for lg, pend in jobs), return_exceptions=True
            )
            if prev is not None:  # its commit (or failure) first: it may move hw
                await asyncio.wait([prev])
            done: list[tuple[PartitionLog, list[PendingBatch], SegmentMeta]] = []
            for (lg, pend), res in zip(jobs, uploads, strict=True):
                if isinstance(res, BaseException):
                    log.warning("segment upload for %s-%d failed: %s", lg.topic, lg.partition, res)
                    lg.failed(pend, ErrorCode.KAFKA_STORAGE_ERROR)
                else:
                    done.append((lg, pend, res))
            done = _contiguous(done)
            per_txn = max(1, self.meta.max_txn_ops // 2)
            async with self.commit_lock:
                for i in range(0, len(done), per_txn):
                    await self._commit(done[i : i + per_txn])
            self.stats["flush_cycles"] += 1
        finally:
            for (lg, _pend), fut in zip(jobs, flushing, strict=True):
                if lg.flushing is fut:
                    lg.flushing = None
                if not fut.done():
                    fut.set_result(None)

    async def _upload(
        self, sem: asyncio.Semaphore, lg: PartitionLog, pend: list[PendingBatch]
    ) -> SegmentMeta:
        async with sem:
            base = pend[0].base_offset
            built = build_segment(
                base, [p.view for p in pend], int(time.time() * 1000), self.config.index_interval
            )
            # one copy: the store body and the tail cache. bytes.join drops the GIL for
            # large joins, so big segments are joined off the event loop
            if built.size >= JOIN_OFF_LOOP_BYTES:
                data = await asyncio.to_thread(b"".join, built.buffers)
            else:
                data = b"".join(built.buffers)
            ns = self.config.namespace
            skey = segment_key(ns, lg.topic, lg.partition, base)
            # both objects at once: each PUT waits mostly on its fsyncs (or S3 round trip)
            _, etag = await asyncio.gather(
                self._put_fresh(index_key(ns, lg.topic, lg.partition, base), built.index, lg),
                self._put_fresh(skey, data, lg),
            )
            self.cache.put(skey, data, parse_index(built.index), etag)
            self.stats["segments"] += 1
            self.stats["segment_bytes"] += built.size
            return SegmentMeta(
                base,
                built.last_offset,
                built.size,
                built.record_count,
                built.max_timestamp,
                etag,
                created_ms=int(time.time() * 1000),
            )

    async def _put_fresh(self, key: str, data: bytes, owner: PartitionLog | None = None) -> str:
        """Conditional PUT; an object already there is not in the manifest (its base is
        past the committed end), so it is a stray from a crash or a fenced owner: delete
        it and try again. With ``owner``, only after checking in the metadata store that
        this broker still owns the partition at the end it knows: a zombie owner (frozen
        past its lease) must never delete the objects a newer owner committed."""
        for _ in range(3):
            try:
                return await self.store.put_if_absent(key, [data])
            except ObjectExistsError:
                if owner is not None and not await self._still_owner(owner):
                    raise StoreError(f"{key} exists and belongs to a newer owner") from None
                log.warning("deleting stray object %s (not in the manifest)", key)
                await self.store.delete(key)
        raise StoreError(f"could not write {key}: it keeps reappearing")

    async def _still_owner(self, lg: PartitionLog) -> bool:
        """True when the owner key still holds our value (broker + epoch: only its holder
        commits); otherwise this broker is fenced: it drops the partition at once."""
        okey = _owner_key(lg.topic, lg.partition)
        res = await self.meta.txn([Compare(okey, "value", "==", lg.owner_value)], [])
        if res.succeeded:
            return True
        log.warning("lost ownership of %s-%d (epoch %d fenced)", lg.topic, lg.partition, lg.epoch)
        if self.logs.get((lg.topic, lg.partition)) is lg:
            self.logs.pop((lg.topic, lg.partition), None)
        lg.close(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        return False

    async def _commit(
        self, chunk: list[tuple[PartitionLog, list[PendingBatch], SegmentMeta]]
    ) -> None:
        try:
            res = await self.meta.txn(*self._commit_ops(chunk))
            self.stats["txns"] += 1
        except MetaStoreError as exc:
            log.warning("manifest commit failed: %s", exc)
            for lg, pend, _seg in chunk:
                lg.failed(pend, ErrorCode.KAFKA_STORAGE_ERROR)
            return
        if res.succeeded:
            for lg, pend, seg in chunk:
                lg.committed(seg, res.revision, pend)
            return
        if len(chunk) > 1:  # find which partition was fenced
            for item in chunk:
                await self._commit([item])
            return
        lg, pend, _seg = chunk[0]
        log.warning("lost ownership of %s-%d (epoch %d fenced)", lg.topic, lg.partition, lg.epoch)
        lg.failed(pend, ErrorCode.NOT_LEADER_OR_FOLLOWER)
        self.logs.pop((lg.topic, lg.partition), None)
        lg.close(ErrorCode.NOT_LEADER_OR_FOLLOWER)

    def _commit_ops(
        self, chunk: Iterable[tuple[PartitionLog, list[PendingBatch], SegmentMeta]]
    ) -> tuple[list[Compare], list[Put]]:
        compares: list[Compare] = []
        ops: list[Put] = []
        for lg, _pend, seg in chunk:
            compares.append(
                Compare(_owner_key(lg.topic, lg.partition), "value", "==", lg.owner_value)
            )
            compares.append(
                Compare(_end_key(lg.topic, lg.partition), "mod_revision", "==", lg.end_rev)
            )
            ops.append(Put(_seg_entry_key(lg.topic, lg.partition, seg.base), seg.to_json()))
            end = end_json(seg.last + 1, lg.epoch, lg.log_start)
            ops.append(Put(_end_key(lg.topic, lg.partition), end))
        return compares, ops

    # -- read path ----------------------------------------------------------------------
    def object_key(self, lg: PartitionLog, seg: SegmentMeta) -> str:
        """The object key of a committed segment (merged ones name theirs in the entry)."""
        if seg.key:
            return partition_prefix(self.config.namespace, lg.topic, lg.partition) + seg.key
        return segment_key(self.config.namespace, lg.topic, lg.partition, seg.base)

    async def _segment_data(self, lg: PartitionLog, seg: SegmentMeta) -> bytes:
        key = self.object_key(lg, seg)
        cached = self.cache.get(key, seg.etag)
        if cached is not None:
            return cached.data  # type: ignore[return-value]
        data = await self.store.get(key, if_match=seg.etag or None)
        self.cache.put(key, data, None, seg.etag)
        return data

    async def read(self, lg: PartitionLog, offset: int, max_bytes: int) -> list[memoryview]:
        """Whole batches from ``offset`` (at least one when any is committed), up to
        ``max_bytes``; continues into following segments while they are cached.

        The segment holding each offset is looked up afresh in ``lg.segments`` (a merge or
        a head truncation may swap the list while a read waits); a segment object gone
        from the store (merged away, then deleted after the grace period) is resolved
        against the current manifest once more before the error is raised."""
        out: list[memoryview] = []
        total = 0
        remote_reads = 0
        retried = False
        while offset < lg.hw and total < max_bytes:
            idx = lg.segment_index(offset)
            if idx < 0:
                break
            seg = lg.segments[idx]
            if seg.last < offset:  # a gap in the manifest: skip to the next segment
                if idx + 1 >= len(lg.segments):
                    break
                offset = lg.segments[idx + 1].base
                continue
            key = self.object_key(lg, seg)
            cached = self.cache.get(key, seg.etag)
            if cached is None and remote_reads:
                break
            try:
                view = await self._read_one(lg, seg, key, cached, offset, max_bytes - total)
            except (ObjectNotFoundError, PreconditionFailedError):
                now = lg.segment_index(offset)
                if retried or now < 0 or lg.segments[now] is seg:
                    raise
                retried = True
                continue
            remote_reads += cached is None
            if len(view) == 0:
                offset = seg.last + 1
                continue
            if out and total + len(view) > max_bytes:
                break
            out.append(view)
            total += len(view)
            last = _last_offset(view)
            if last < seg.last:  # the budget ended inside this segment
                break
            offset = last + 1
        return out

    async def _read_one(
        self,
        lg: PartitionLog,
        seg: SegmentMeta,
        key: str,
        cached: CachedSegment | None,
        offset: int,
        budget: int,
    ) -> memoryview:
        if cached is not None:
            return slice_batches(cached.data, cached.index, offset, budget)
        if seg.size <= WHOLE_READ_LIMIT:
            return slice_batches(await self._segment_data(lg, seg), None, offset, budget)
        index = parse_index(await self.store.get(index_key_for(key)))
        return await read_from(self.store, key, index, offset, budget, seg.size, seg.etag)

    async def segment_batches(self, lg: PartitionLog, seg: SegmentMeta) -> bytes:
        """The whole segment object (cached), for timestamp lookups."""
        return await self._segment_data(lg, seg)


def _contiguous(
    done: list[tuple[PartitionLog, list[PendingBatch], SegmentMeta]],
) -> list[tuple[PartitionLog, list[PendingBatch], SegmentMeta]]:
    """Drop (and fail) segments that no longer start at their log's committed end: an
    earlier cycle of that partition failed and rewound it (its appends were rolled back
    then), or the partition was closed. Committing them would leave a gap."""
    keep = []
    for lg, pend, seg in done:
        if seg.base == lg.hw and lg.state != CLOSED:
            keep.append((lg, pend, seg))
            continue
        closed = lg.state == CLOSED
        code = ErrorCode.NOT_LEADER_OR_FOLLOWER if closed else ErrorCode.KAFKA_STORAGE_ERROR
        for p in pend:
            if not p.future.done():
                p.future.set_exception(AppendError(code))
                p.future.exception()  # mark retrieved: waiters may be gone
    return keep


def _last_offset(view: memoryview) -> int:
    last = -1
    for hdr, _ in iter_batches(view):
        last = hdr.last_offset
    return last
