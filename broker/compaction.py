"""Log compaction on the partition owner, beside merging (docs/format.md, "Compacted
segments"; the pure policy is ``broker.compaction_policy``).

For a topic whose ``cleanup.policy`` includes ``compact``, ``Maintenance`` asks the
``Compactor`` after its merges whether the partition is due (dirty ratio, max compaction
lag, tombstones past their horizon). A pass:

1. maps key -> latest offset over the cleanable dirty segments, one segment at a time,
   until the key map (``--compaction-buffer-bytes``) is full: a larger backlog takes
   several passes;
2. rewrites the log from its head to the end of what it mapped, segment by segment
   (memory is one source segment plus one output segment), keeping the latest record
   per key at its original offset, and writes each output (at most ``--merge-max-bytes``)
   as a compacted KAFS segment under a writer-unique name;
3. swaps the outputs in for the segments they replace in ONE metadata transaction per
   chunk (at the store's transaction limit) through the ``Committer``, guarded like
   every manifest transaction by the owner value and the end revision;
4. hands the replaced objects to the ``ObjectDeleter`` (deleted after the grace period).

Reads and writes are throttled (``--compaction-max-bytes-per-sec``); the CPU work on
records runs in a worker thread so the event loop keeps serving. A crash anywhere leaves
the old manifest intact; the outputs it wrote are garbage a new owner sweeps.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker import faults
from broker.commit import Outcome
from broker.compaction_policy import (
    NO_TOMBSTONES,
    CompactionConfig,
    DirtyState,
    KeyMap,
    RecordFilter,
    Rewritten,
    collapse,
    compaction_of,
    dirty_state,
    expired_tombstones,
    is_due,
    rewrite_batches,
)
from broker.meta.base import Delete, Put
from broker.meta.schema import seg_entry_key
from broker.partition import ACTIVE, PartitionLog, SegmentMeta
from broker.txn_compaction import aborted_batch, cleanable_below_lso
from broker.txn_partition import PartitionTxns, state_of
from protocol.compaction import record_columns
from segments.format import iter_segment_batches, partition_prefix
from segments.store import Buffer
from segments.writer import build_segment

if TYPE_CHECKING:
    from broker.deletion import ObjectDeleter
    from broker.logs import LogManager

log = logging.getLogger(__name__)


class Throttle:
    """Bytes per second over a pass (0: unlimited); sleeping here paces the work."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.start = time.monotonic()
        self.done = 0

    async def consume(self, nbytes: int) -> None:
        if self.rate <= 0:
            return
        self.done += nbytes
        ahead = self.done / self.rate - (time.monotonic() - self.start)
        if ahead > 0:
            await asyncio.sleep(ahead)


@dataclass(slots=True)
class _Output:
    sources: list[SegmentMeta] = field(default_factory=list)
    batches: list[bytes | memoryview] = field(default_factory=list)
    tombstones: list[tuple[int, int]] = field(default_factory=list)
    records: int = 0
    size: int = 0
    max_ts: int = -1

    def add(self, seg: SegmentMeta, rw: Rewritten) -> None:
        self.max_ts = max(self.max_ts, rw.max_ts)
        self.sources.append(seg)
        # copies: a view would keep its whole source segment in memory
        self.batches += [b if isinstance(b, bytes) else bytes(b) for b in rw.batches]
        self.tombstones += rw.tombstones
        self.records += rw.records_out
        self.size += rw.size


@dataclass(slots=True)
class _Pass:
    lg: PartitionLog
    filt: RecordFilter
    codec: int | None
    producers: dict[int, int]  # producer id -> base offset of its last batch
    now_ms: int
    throttle: Throttle
    written: list[tuple[list[SegmentMeta], SegmentMeta]] = field(default_factory=list)


def _map_segment(
    data: Buffer, keys: KeyMap, first: bool, txns: PartitionTxns | None = None
) -> bool:
    """Add the keys of one segment to ``keys``, batch by batch; False when the map filled
    up before the segment's end (the first segment of a pass is always mapped whole, so
    every pass makes progress). A partly mapped segment is safe: a record is only removed
    when a later record of its key is in the log. Records of aborted transactions are not
    mapped: they never supersede a committed record (Kafka's cleaner does the same)."""
    for _pos, hdr, view in iter_segment_batches(data):
        if hdr.is_control or hdr.record_count == 0:
            continue
        if aborted_batch(txns, hdr):
            continue
        if not first and not keys.room_for(hdr.record_count):
            return False
        keys.add(record_columns(view))
    return True


class Compactor:
    """Driven by ``Maintenance``; ``compact`` runs one pass (tests call it directly)."""

    def __init__(self, logs: LogManager, deleter: ObjectDeleter) -> None:
        self.logs = logs
        self.config = logs.config
        self.deleter = deleter
        self.stats = {
            "passes": 0,
            "bytes_read": 0,
            "bytes_written": 0,
            "records_removed": 0,
            "segments_replaced": 0,
            "bytes_compacted": 0,
        }
        # per owned partition: (dirty ratio, age ms of the oldest cleanable dirty record)
        self.gauges: dict[tuple[str, int], tuple[float, int]] = {}

    def topic_config(self, lg: PartitionLog) -> CompactionConfig | None:
        info = self.logs.topics.get(lg.topic)
        if info is None:
            return None
        return self.logs.topics.derived(info, compaction_of)

    async def _stable_state(
        self, lg: PartitionLog, segs: Sequence[SegmentMeta], now_ms: int, cfg: CompactionConfig
    ) -> DirtyState:
        """``dirty_state`` with the cleanable range ending below the last stable offset:
        an open transaction's records (and everything after its first) are not compacted
        until it ends, since its outcome decides which record of a key is the latest."""
        state = dirty_state(segs, now_ms, cfg)
        lso = (await state_of(self.logs.meta, lg)).lso(lg.hw)
        end = max(state.clean, cleanable_below_lso(segs, state.end, lso))
        if end == state.end:
            return state
        return dirty_state(segs[:end], now_ms, cfg)

    def forget(self, lg: PartitionLog) -> None:
        self.gauges.pop((lg.topic, lg.partition), None)

    def idle(self, lg: PartitionLog) -> bool:
        """Whether ``maybe_compact`` has nothing to look at: ``lg``'s topic is not
        compacted (what it keeps of the partition is dropped, as ``maybe_compact`` does)."""
        if self.topic_config(lg) is not None:
            return False
        self.forget(lg)
        return True

    async def maybe_compact(self, lg: PartitionLog, now_ms: int | None = None) -> bool:
        """Run a pass when the partition is due; returns whether one committed."""
        cfg = self.topic_config(lg)
        if cfg is None:
            self.forget(lg)
            return False
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        segs = lg.segments
        state = await self._stable_state(lg, segs, now_ms, cfg)
        age = now_ms - state.oldest_dirty_ms if state.oldest_dirty_ms >= 0 else 0
        self.gauges[(lg.topic, lg.partition)] = (state.ratio, age)
        if not is_due(state, segs, now_ms, cfg):
            return False
        return await self.compact(lg, cfg, now_ms)

    async def compact(
        self, lg: PartitionLog, cfg: CompactionConfig, now_ms: int | None = None
    ) -> bool:
        """One pass (see the module doc); returns whether it committed anything."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        segs = list(lg.segments)
        if not segs:
            return False
        state = await self._stable_state(lg, segs, now_ms, cfg)
        # the aborted-transaction index as the pass starts (read from worker threads)
        txns = PartitionTxns(aborted=list((await state_of(self.logs.meta, lg)).aborted))
        throttle = Throttle(self.config.compaction_max_bytes_per_sec)
        keys = KeyMap(self.config.compaction_buffer_bytes)
        end = state.clean
        for i in range(state.clean, state.end):  # 1. the key map
            data = await self._read(lg, segs[i], throttle)
            if not await asyncio.to_thread(_map_segment, data, keys, i == state.clean, txns):
                break  # the map is full: the rest waits for the next pass
            end = i + 1
        if end == state.clean and not expired_tombstones(
            segs, state.clean, now_ms, cfg.delete_retention_ms
        ):
            return False
        filt = RecordFilter(keys, now_ms, cfg.delete_retention_ms, log_end=segs[-1].last + 1)
        # aborted transactions' batches stay whole, like their markers (broker/txn_compaction.py)
        filt.batch_rules.append(lambda hdr: True if aborted_batch(txns, hdr) else None)
        pass_ = _Pass(lg, filt, cfg.codec, lg.producers.last_bases(), now_ms, throttle)
        try:
            committed = await self._rewrite(pass_, segs[:end])
        except Exception:
            # outputs whose commit was never attempted can never be named: delete them now
            if pass_.written and self._current(lg):
                await self.logs.discard(lg, [self.logs.object_key(lg, m) for _, m in pass_.written])
            raise
        if committed:
            self.stats["passes"] += 1
        return committed

    async def _rewrite(self, p: _Pass, sources: list[SegmentMeta]) -> bool:
        lg = p.lg
        max_ops = max(2, self.logs.meta.max_txn_ops - 1)
        out = _Output()
        committed = False
        for seg in sources:  # 2. the rewrite, segment by segment
            if not self._current(lg):
                return committed
            data = await self._read(lg, seg, p.throttle)
            p.filt.cleaned = seg.cleaned
            batches = ((hdr, view) for _pos, hdr, view in iter_segment_batches(data))
            rw = await asyncio.to_thread(rewrite_batches, batches, p.filt, p.codec, p.producers)
            self.stats["records_removed"] += rw.records_in - rw.records_out
            if out.sources and (
                out.size + rw.size > self.config.merge_max_bytes or len(out.sources) >= max_ops
            ):
                p.written.append(await self._write(lg, out, p.now_ms, p.throttle))
                out = _Output()
            out.add(seg, rw)
            if sum(len(s) for s, _ in p.written) + len(out.sources) > max_ops and p.written:
                # 3. the swap, per chunk, in offset order; a chunk that fails ends the pass:
                # a tombstone is never removed before the older records of its key
                chunk, p.written = p.written, []
                if not await self._commit(lg, chunk):
                    return committed  # (the open output was not written yet)
                committed = True
        if out.sources:
            p.written.append(await self._write(lg, out, p.now_ms, p.throttle))
        chunk, p.written = p.written, []
        if chunk and await self._commit(lg, chunk):
            return True
        return committed

    def _current(self, lg: PartitionLog) -> bool:
        return lg.state == ACTIVE and self.logs.logs.get((lg.topic, lg.partition)) is lg

    async def _read(self, lg: PartitionLog, seg: SegmentMeta, throttle: Throttle) -> Buffer:
        """A whole segment, from the cache when it is there; never put into the cache (a
        pass over a large log would evict what tailing consumers read)."""
        key = self.logs.object_key(lg, seg)
        cached = self.logs.cache.get(key, seg.etag)
        if cached is not None:
            data: Buffer = cached.data
        else:
            data = await self.logs.store.get(key, if_match=seg.etag or None)
        self.stats["bytes_read"] += len(data)
        await throttle.consume(len(data))
        return data

    async def _write(
        self, lg: PartitionLog, out: _Output, now_ms: int, throttle: Throttle
    ) -> tuple[list[SegmentMeta], SegmentMeta]:
        first, last = out.sources[0], out.sources[-1]
        views = [memoryview(b) for b in out.batches]
        created = max(s.created_ms for s in out.sources)
        built = build_segment(
            first.base, views, now_ms, self.config.index_interval, compacted_last=last.last
        )
        name = lg.new_object_name(first.base, last.last)
        key = partition_prefix(self.config.namespace, lg.topic, lg.partition) + name
        data = b"".join(built.buffers)
        store = self.logs.store
        etag = await store.put_if_absent(key, [data], crc32c=built.crc32c)  # index inside
        self.stats["bytes_written"] += len(data)
        await throttle.consume(len(data))
        cleaned = collapse([(first.base, NO_TOMBSTONES), *out.tombstones])
        meta = SegmentMeta(
            first.base,
            last.last,
            built.size,
            out.records,
            out.max_ts,  # of what is left (retention also counts from ``created``)
            etag,
            name,
            created,
            cleaned,
            built.version,
        )
        return list(out.sources), meta

    async def _commit(
        self, lg: PartitionLog, written: list[tuple[list[SegmentMeta], SegmentMeta]]
    ) -> bool:
        """Swap ``written`` in: one guarded transaction. Outputs that can never be
        committed are deleted at once (only while this broker still owns the log)."""
        logs = self.logs
        outputs = [m for _, m in written]
        sources = [s for srcs, _ in written for s in srcs]
        faults.checkpoint("compaction.before_commit")
        async with logs.committer.lock:
            ids = {id(s) for s in sources}
            if not self._current(lg) or sum(id(s) in ids for s in lg.segments) != len(sources):
                if self._current(lg):  # the manifest moved (DeleteRecords): never sent
                    await logs.discard(lg, [logs.object_key(lg, m) for m in outputs])
                return False
            t, p = lg.topic, lg.partition
            bases = {m.base for m in outputs}
            ops: list[Put | Delete] = [
                Delete(seg_entry_key(t, p, s.base)) for s in sources if s.base not in bases
            ]
            probes = {seg_entry_key(t, p, m.base): m.to_json() for m in outputs}
            ops += [Put(k, v) for k, v in probes.items()]
            res = await logs.committer.commit([lg], ops, probes, moves_end=False)
            if res.outcome is Outcome.COMMITTED:
                by_first = {id(srcs[0]): m for srcs, m in written}
                lg.set_segments(
                    [
                        by_first.get(id(s), s)
                        for s in lg.segments
                        if id(s) not in ids or id(s) in by_first
                    ]
                )
                if res.fenced:
                    logs.drop(lg, "fenced after its compaction committed")
            elif res.outcome is Outcome.UNKNOWN:
                logs.drop(lg, "a compaction commit has an unknown outcome")
                return False
            elif res.fenced or not res.resolved:
                logs.drop(lg, "fenced (compaction)")
                return False
            else:
                await logs.discard(lg, [logs.object_key(lg, m) for m in outputs])
                return False
        if self._current(lg):
            self.deleter.retire(lg, sources)
        self.stats["segments_replaced"] += len(sources)
        self.stats["bytes_compacted"] += sum(s.size for s in sources)
        log.debug(
            "compacted %d segments of %s-%d into %d", len(sources), lg.topic, lg.partition,
            len(outputs),
        )  # fmt: skip
        return True
