"""The write path: flush cycles that turn buffered appends into committed segments.

Handlers append to a ``PartitionLog`` (offsets assigned in memory) and call
``Flusher.appended``. A single flusher task runs *flush cycles*: when any partition's
buffer reaches ``flush_bytes`` or its oldest batch is ``flush_interval_ms`` old, it takes
every ready partition's buffer, writes each as ONE segment object (its index inside,
docs/format.md) under a writer-unique object name ("Object keys") with a conditional PUT,
then commits ONE
metadata transaction for the cycle (chunked at the store's operation limit, the chunks
sent together) through the
``Committer``: guarded by each partition's owner value and end revision, it appends the
manifest entries and the new log ends. Only then are the appends acknowledged.

A commit whose outcome the metadata store cannot confirm is resolved before anything
depends on it (``broker.commit``): committed records are acknowledged, certainly
uncommitted ones fail with a retriable error (and their objects, never referenced, are
deleted at once), and while the outcome is unknown the producers get a retriable error,
nothing is deleted and the partition is dropped so that its next owner starts from what
the store holds. Objects are never deleted to make room for a write: names are unique.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, NamedTuple

from broker import faults
from broker.commit import CommitResult, Outcome
from broker.meta.base import Put
from broker.meta.schema import end_key, seg_entry_key
from broker.partition import CLOSED, AppendError, PartitionLog, PendingBatch, SegmentMeta
from broker.shared_objects import SharedWriter
from broker.tasks import cancel_and_wait
from protocol.errors import ErrorCode
from segments.format import BuiltSegment, partition_prefix
from segments.joins import join
from segments.offload import to_thread
from segments.shared import is_range_key
from segments.store import PutItem, put_all
from segments.writer import build_segment

if TYPE_CHECKING:
    from broker.logs import LogManager

log = logging.getLogger(__name__)

MAX_CYCLES_IN_FLIGHT = 2
# entries per cycle key (~250 bytes each): well inside etcd's 1.5 MiB request limit
CYCLE_MAX_ENTRIES = 2000
JOIN_OFF_LOOP_BYTES = 1 << 20

Job = tuple[PartitionLog, list[PendingBatch]]


class Built(NamedTuple):
    """A job's segment, ready for its PUT."""

    segment: BuiltSegment
    data: bytes
    name: str
    key: str


Done = tuple[PartitionLog, list[PendingBatch], SegmentMeta]


class Flusher:
    """Flush cycles of the logs this broker owns (started and stopped by LogManager)."""

    def __init__(self, logs: LogManager) -> None:
        self.logs = logs
        self.config = logs.config
        self._dirty: set[PartitionLog] = set()
        self._wake = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        # flush cycles in flight: the next one uploads while the last one commits
        self._cycles: list[asyncio.Task[None]] = []
        self.stats = {
            "flush_cycles": 0, "segments": 0, "segment_bytes": 0, "txns": 0,
            "shared_objects": 0, "shared_segments": 0,
        }  # fmt: skip
        self.shared = SharedWriter(logs)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="flusher")

    async def stop(self) -> None:
        """Stop the loop, and any cycle still in flight (a stop that gave up flushing,
        ``LogManager._flush_while_leased``): ended there as by a crash, nothing deleted."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        await cancel_and_wait(*self._cycles)

    def appended(self, lg: PartitionLog, nbytes: int) -> None:
        """Tell the flusher ``lg`` has new data (called after PartitionLog.append)."""
        self._dirty.add(lg)
        # no cycle in flight: nothing to batch with but the appends of this loop pass,
        # which the flusher task takes too (it runs after them); waiting out the flush
        # interval would only add to the round trip (docs/benchmarks.md, "Round 3: produce
        # profile")
        idle = self.config.flush_when_idle and not self._cycles
        if lg.pending_bytes >= self.config.flush_bytes or idle:
            self._wake.set()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(
                self.config.flush_interval_ms / 1000, self._fire
            )

    def _fire(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:  # how late it ran: the event loop's lag (docs/benchmarks.md)
            late = asyncio.get_running_loop().time() - timer.when()
            self.logs.metrics.flush_timer_delay.observe(max(0.0, late))
        self._wake.set()

    def _cycle_done(self, task: asyncio.Task[None]) -> None:
        self._cycles.remove(task)
        # flush-when-idle also when the last cycle in flight has just ended: what was
        # appended meanwhile starts its cycle now instead of waiting out its flush timer
        # on an idle flusher (docs/benchmarks.md, "Round 4: paced p99")
        if self.config.flush_when_idle and not self._cycles:
            if any(lg.pending for lg in self._dirty):
                self._wake.set()

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

    async def idle(self) -> None:
        """Wait until no flush cycle is in flight (its commit, failure handling and the
        deletion of objects it certainly never committed all done)."""
        while self._cycles:
            await asyncio.wait(list(self._cycles))

    async def _loop(self) -> None:
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
        now = asyncio.get_running_loop().time()
        waited = self.logs.metrics.flush_wait
        for lg in ready:  # how long its oldest batch waited for a cycle (docs/benchmarks.md)
            waited.observe(now - lg.pending_since)
        jobs = [(lg, lg.take_pending()) for lg in ready]
        task = asyncio.create_task(self._run_cycle(jobs, prev), name="flush-cycle")
        self._cycles.append(task)
        task.add_done_callback(self._cycle_done)

    async def _run_cycle(self, jobs: list[Job], prev: asyncio.Task[None] | None) -> None:
        started = time.perf_counter()
        try:
            await self.cycle(jobs, prev)
        except Exception:  # never let a failed cycle go unlogged
            log.exception("flush cycle failed")
            if prev is not None:  # failing rewinds to hw: the previous cycle may move it
                await asyncio.wait([prev])
            for lg, pend in jobs:  # nothing may wait forever on a cycle that died
                lg.failed(pend, ErrorCode.KAFKA_STORAGE_ERROR)
        finally:
            self.logs.metrics.flush_cycle.observe(time.perf_counter() - started)

    async def cycle(self, jobs: list[Job], prev: asyncio.Task[None] | None = None) -> None:
        loop = asyncio.get_running_loop()
        flushing: list[asyncio.Future[None]] = []
        for lg, _pend in jobs:
            lg.flushing = loop.create_future()
            flushing.append(lg.flushing)
        try:
            uploads = await self._upload_all(jobs)
            ordered = time.perf_counter()
            if prev is not None:  # its commit (or failure) first: it may move hw
                await asyncio.wait([prev])
            self.logs.metrics.flush_order_wait.observe(time.perf_counter() - ordered)
            done: list[Done] = []
            for (lg, pend), res in zip(jobs, uploads, strict=True):
                if isinstance(res, BaseException):
                    log.warning("segment upload for %s-%d failed: %s", lg.topic, lg.partition, res)
                    lg.failed(pend, ErrorCode.KAFKA_STORAGE_ERROR)
                else:
                    done.append((lg, pend, res))
            done = await self._contiguous(done)
            per_txn = max(1, self.logs.meta.max_txn_ops // 2)
            chunks = [done[i : i + per_txn] for i in range(0, len(done), per_txn)]
            async with self.logs.committer.lock:
                if done and self.logs.folder.enabled([lg for lg, _p, _s in done]):
                    for i in range(0, len(done), CYCLE_MAX_ENTRIES):
                        await self._commit_cycle(done[i : i + CYCLE_MAX_ENTRIES])
                elif len(chunks) == 1:
                    await self._commit(chunks[0])
                else:  # disjoint partitions, each chunk guarded and settled on its own:
                    # sent together (etcd pipelines them; the embedded store writes them
                    # in one append), and any error raised once every chunk is settled
                    settled = await asyncio.gather(
                        *(self._commit(c) for c in chunks), return_exceptions=True
                    )
                    for err in settled:
                        if isinstance(err, BaseException):
                            raise err
            self.stats["flush_cycles"] += 1
        finally:
            for (lg, _pend), fut in zip(jobs, flushing, strict=True):
                if lg.flushing is fut:
                    lg.flushing = None
                if not fut.done():
                    fut.set_result(None)

    async def _upload_all(self, jobs: list[Job]) -> list[SegmentMeta | BaseException]:
        """Build each job's segment and PUT them all (``put_all``: on the local store one
        durability barrier for the whole cycle, segments/local_batch.py); per job its
        SegmentMeta or why it failed."""
        built = await self._build_all(jobs)
        shared = self.shared.place(jobs, built)  # the small segments as one object
        if shared is not None:
            built = shared.built
        built = [self._named(lg, b) for (lg, _pend), b in zip(jobs, built, strict=True)]
        items = [  # one object per other partition (its index is its trailer)
            PutItem(b.key, [b.data], b.segment.crc32c)
            for b in built
            if not isinstance(b, BaseException) and not is_range_key(b.key)
        ]
        if shared is not None:
            items.insert(0, shared.item)
        faults.checkpoint("flush.before_put")
        put_started = time.perf_counter()
        put = await put_all(self.logs.store, items, self.config.flush_concurrency)
        took = time.perf_counter() - put_started
        first: str | BaseException = ""
        if shared is not None:
            first, put = put[0], put[1:]
            if isinstance(first, BaseException):
                await self.shared.discard(shared)
            else:
                self.stats["shared_objects"] += 1
                self.stats["shared_segments"] += len(shared.item.data) - 1
        results = iter(put)
        out: list[SegmentMeta | BaseException] = []
        for (lg, pend), b in zip(jobs, built, strict=True):
            if isinstance(b, BaseException):
                out.append(b)
                continue
            res = first if is_range_key(b.key) else next(results)
            if isinstance(res, BaseException):
                # never committed, and the name is ours alone: nothing else can need it
                await self.logs.discard(lg, [b.key])
                out.append(res)
                continue
            self.logs.metrics.segment_put.observe(took)
            out.append(self._finish(lg, pend, b, res))
        return out

    async def _build_all(self, jobs: list[Job]) -> list[Built | BaseException]:
        """Each job's segment, built and joined into one buffer (or why it failed), not
        named yet. One copy: the store body and the tail cache. Small segments are built
        here with no task per partition (docs/benchmarks.md, "Round 15"); big segments are
        joined off the event loop, without the GIL (``segments.joins``), together
        (from the one malloc arena, broker/cli_broker.py: the memory of evicted segments
        is reused)."""
        out: list[Built | BaseException] = []
        large: list[tuple[int, BuiltSegment]] = []  # (where in out, its segment)
        now = int(time.time() * 1000)
        for _lg, pend in jobs:
            try:
                seg = build_segment(
                    pend[0].base_offset,
                    [p.view for p in pend],
                    now,
                    self.config.index_interval,
                    # verified on produce (or computed here): no second pass for the CRC
                    batch_crcs=[p.header.crc for p in pend],
                )
            except Exception as exc:  # noqa: BLE001 - this job fails alone, as a PUT would
                out.append(exc)
                continue
            if seg.size >= JOIN_OFF_LOOP_BYTES:
                large.append((len(out), seg))
                out.append(Built(seg, b"", "", ""))  # joined below
            else:
                out.append(Built(seg, b"".join(seg.buffers), "", ""))
        if large:
            joined = await asyncio.gather(
                *(to_thread(join, seg.buffers) for _i, seg in large),
                return_exceptions=True,
            )
            for (i, seg), data in zip(large, joined, strict=True):
                out[i] = data if isinstance(data, BaseException) else Built(seg, data, "", "")
        return out

    def _named(self, lg: PartitionLog, b: Built | BaseException) -> Built | BaseException:
        """``b`` with its own object's name and key, unless it is placed in a shared one
        (the name is taken only for a segment that gets its own object)."""
        if isinstance(b, BaseException) or b.key:
            return b
        name = lg.new_object_name(b.segment.base_offset, b.segment.last_offset)
        prefix = partition_prefix(self.config.namespace, lg.topic, lg.partition)
        return b._replace(name=name, key=prefix + name)

    def _finish(
        self, lg: PartitionLog, pend: list[PendingBatch], b: Built, etag: str
    ) -> SegmentMeta:
        """A segment written: into the tail cache, counted, and described for its commit."""
        built = b.segment
        self.logs.cache.put(b.key, b.data, built.entries, etag)
        self.stats["segments"] += 1
        self.stats["segment_bytes"] += built.size
        self.logs.metrics.segment_written(lg.topic, built.size, built.record_count, pend)
        return SegmentMeta(
            pend[0].base_offset,
            built.last_offset,
            built.size,
            built.record_count,
            built.max_timestamp,
            etag,
            b.name,
            created_ms=int(time.time() * 1000),
            version=built.version,
        )

    async def _contiguous(self, done: list[Done]) -> list[Done]:
        """Drop (and fail) segments that no longer start at their log's committed end: an
        earlier cycle of that partition failed and rewound it (its appends were rolled
        back then), or the partition was closed. Committing them would leave a gap."""
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
            if not closed:  # never sent for commit: garbage only this owner could name
                await self.logs.discard(lg, [self.logs.object_key(lg, seg)])
        return keep

    async def _commit(self, chunk: list[Done]) -> None:
        ops: list[Put] = []
        probes: dict[str, bytes] = {}
        for lg, _pend, seg in chunk:
            entry = seg.to_json()
            ops.append(Put(seg_entry_key(lg.topic, lg.partition, seg.base), entry))
            ops.append(Put(end_key(lg.topic, lg.partition), lg.end_at(seg.last + 1)))
            probes[seg_entry_key(lg.topic, lg.partition, seg.base)] = entry
        lgs = [lg for lg, _pend, _seg in chunk]
        started = time.perf_counter()
        res = await self.logs.committer.commit(lgs, ops, probes, moves_end=True)
        self.logs.metrics.flush_commit.observe(time.perf_counter() - started)
        self.stats["txns"] += 1
        if res.outcome is Outcome.COMMITTED:
            for lg, pend, seg in chunk:
                lg.committed(seg, res.revision, pend)
            self._close_fenced(res)
            return
        if res.outcome is Outcome.UNKNOWN:
            self._unknown(chunk)
            return
        if not res.resolved and len(chunk) > 1:  # find which partition was fenced
            for item in chunk:
                await self._commit([item])
            return
        await self._rejected(chunk, res)

    async def _commit_cycle(self, done: list[Done]) -> None:
        """Commit ``done`` as one cycle key (broker/fold.py): acknowledged at once, folded
        into the partitions' own keys later."""
        started = time.perf_counter()
        res, key = await self.logs.folder.commit_cycle([(lg, seg) for lg, _p, seg in done])
        self.logs.metrics.flush_commit.observe(time.perf_counter() - started)
        self.stats["txns"] += 1
        if res.outcome is Outcome.COMMITTED:
            for lg, pend, seg in done:
                lg.committed_in_cycle(seg, key, pend)
            self.logs.folder.committed(key, [lg for lg, _p, _s in done])
            return
        if res.outcome is Outcome.UNKNOWN:
            self._unknown(done)
            return
        if not res.resolved:  # the registration is gone: so is every owner key of ours
            log.warning("cycle commit %s fenced: this broker's registration is gone", key)
        await self._rejected(done, CommitResult(Outcome.REJECTED, resolved=res.resolved))

    def _unknown(self, chunk: list[Done]) -> None:
        """The commit's outcome stays unknown: a retriable error, nothing deleted, and the
        logs dropped (their next take starts from what the store holds)."""
        for lg, pend, _seg in chunk:
            lg.failed(pend, ErrorCode.KAFKA_STORAGE_ERROR)
            self.logs.drop(lg, "its last commit has an unknown outcome")

    async def _rejected(self, chunk: list[Done], res: CommitResult) -> None:
        """Certainly not committed (and never will be): fail the appends."""
        fenced = set(res.fenced) if res.resolved else {lg for lg, _p, _s in chunk}
        for lg, pend, seg in chunk:
            if lg in fenced:
                log.warning(
                    "lost ownership of %s-%d (epoch %d fenced)", lg.topic, lg.partition, lg.epoch
                )
                lg.failed(pend, ErrorCode.NOT_LEADER_OR_FOLLOWER)
                self.logs.drop(lg, "fenced")
            else:
                lg.failed(pend, ErrorCode.KAFKA_STORAGE_ERROR)
                await self.logs.discard(lg, [self.logs.object_key(lg, seg)])

    def _close_fenced(self, res: CommitResult) -> None:
        for lg in res.fenced:
            log.warning("lost ownership of %s-%d after its last commit", lg.topic, lg.partition)
            self.logs.drop(lg, "fenced")
