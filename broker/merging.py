"""Merging small segments on the partition owner (docs/format.md, "Merged segments and the
log start"): a ``Merger`` plans runs of small committed segments (``plan_merges``), writes
each run as one segment under a writer-unique name, commits it through the ``Committer``
and retires the run's objects. ``broker.maintenance`` calls it once per pass for every
owned partition.

A partition is planned only when something can have changed the plan since its last look:
its segments (``PartitionLog.changes``), its log start or folded end, or the time a small
segment comes of age (``next_merge_look``). A broker with thousands of idle partitions
then looks at none of them between those times.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from broker import faults
from broker.commit import Outcome
from broker.deletion import ObjectDeleter
from broker.maintenance_policy import next_merge_look, plan_merges
from broker.meta.base import Delete, Put
from broker.meta.schema import seg_entry_key
from broker.partition import PartitionLog, SegmentMeta
from segments.format import BuiltSegment, iter_batch_frames, partition_prefix
from segments.joins import join
from segments.offload import to_thread
from segments.store import Buffer, put_background
from segments.writer import build_segment

if TYPE_CHECKING:
    from broker.logs import LogManager

log = logging.getLogger(__name__)

# a range of a shared object is merged even alone once it is this old (and merge-min-age)
SHARED_RELEASE_S = 60.0
# segments a merge loads from the store at once (the evicted ones of its run). Each load
# holds a thread of the offloader the flush's PUTs and metadata appends use: 16 at once
# took all its threads, and a flush cycle waited 20-40 ms behind them
# (docs/benchmarks.md, "Round 20")
MERGE_LOADS = 2

# what the plan of a partition follows from, besides time: (changes, log start, folded
# end) of the partition, and (small bytes, min age, release age) of the settings
_Look = tuple[int, int, int, int, float, float]


def _build_merged(
    base: int, datas: list[Buffer], now_ms: int, index_interval: int
) -> tuple[BuiltSegment, bytes]:
    """The merged segment of a run's segment bodies and its joined bytes. Run in a thread:
    walking a second's worth of batches and copying them blocks for milliseconds, during
    which the event loop would hold back every flush cycle (docs/benchmarks.md,
    "Round 19"); in a thread the interpreter hands the loop the GIL every switch
    interval, and the copy releases it (``segments.joins``, "Round 20")."""
    views = [view for data in datas for _pos, _first, view in iter_batch_frames(data)]
    built = build_segment(base, views, now_ms, index_interval)
    return built, join(built.buffers)


class Merger:
    """Merges of the partitions this broker owns; ``stats`` is the maintenance's."""

    def __init__(
        self,
        logs: LogManager,
        deleter: ObjectDeleter,
        stats: dict[str, int],
        current: Callable[[PartitionLog], bool],
    ) -> None:
        self.logs = logs
        self.config = logs.config
        self.deleter = deleter
        self.stats = stats
        self._current = current
        self._seen: dict[tuple[str, int], dict[int, float]] = {}  # first seen per base
        # partitions with nothing to merge: (log, what its plan followed from, the
        # monotonic time a segment comes of age); not planned again before either moves
        self._quiet: dict[tuple[str, int], tuple[PartitionLog, _Look, float]] = {}

    def forget(self, lg: PartitionLog) -> None:
        tp = (lg.topic, lg.partition)
        if tp in self._quiet and self._quiet[tp][0] is lg:
            del self._quiet[tp]

    def prune(self, live: set[tuple[str, int]]) -> None:
        """Drop what is kept of partitions no longer owned."""
        for tp in [tp for tp in self._seen if tp not in live]:
            del self._seen[tp]
            self._quiet.pop(tp, None)

    def _look(self, lg: PartitionLog) -> _Look:
        """What a look at ``lg`` plans from: its segments' changes and the settings."""
        cfg = self.config
        min_age = cfg.merge_min_age_ms / 1000
        return (lg.changes, lg.log_start, lg.folded, cfg.merge_small_bytes, min_age,
                max(min_age, SHARED_RELEASE_S))  # fmt: skip

    def quiet(self, lg: PartitionLog, now: float) -> bool:
        """Whether a look at ``lg`` now would plan nothing: it had nothing to merge at the
        last look, nothing changed since and no segment has come of age (the maintenance
        pass skips such partitions without a coroutine; ``merge_partition`` returns 0)."""
        quiet = self._quiet.get((lg.topic, lg.partition))
        return (quiet is not None and quiet[0] is lg and now < quiet[2]
                and quiet[1] == self._look(lg))  # fmt: skip

    async def merge_partition(self, lg: PartitionLog, now: float | None = None) -> int:
        """Merge every eligible run of small segments of ``lg``; returns runs merged.
        ``now``: the monotonic clock as this look reads it (tests)."""
        now = time.monotonic() if now is None else now
        if self.quiet(lg, now):
            return 0  # nothing changed and no segment came of age since the last look
        cfg, tp, look = self.config, (lg.topic, lg.partition), self._look(lg)
        small, min_age, release_age = look[3:]
        self.stats["merge_plans"] += 1
        old = self._seen.get(tp, {})
        seen = {b: old.get(b, now) for b in lg.bases}
        self._seen[tp] = seen
        runs = plan_merges(
            lg.segments,
            lambda s: (
                now - seen.get(s.base, now) >= min_age
                and s.last >= lg.log_start
                and not s.cleaned  # compacted segments are merged by compaction itself
                and s.base < lg.folded  # in a cycle key still: merged once folded
            ),
            small,
            cfg.merge_max_bytes,
            cfg.merge_min_segments,
            max(2, self.logs.meta.max_txn_ops - 1),
            # a shared range with no neighbours to merge with after a minute: copied alone
            lambda s: s.key.startswith("~") and now - seen.get(s.base, now) >= release_age,
        )
        if not runs:
            until = next_merge_look(lg.segments, seen, now, small, min_age, release_age)
            self._quiet[tp] = (lg, look, until)
            return 0
        self._quiet.pop(tp, None)
        done = 0
        for run in runs:
            if await self._merge_run(lg, run):
                done += 1
            if not self._current(lg):
                break
        return done

    async def _merge_run(self, lg: PartitionLog, run: list[SegmentMeta]) -> bool:
        logs = self.logs
        sem = asyncio.Semaphore(MERGE_LOADS)

        async def fetch(seg: SegmentMeta) -> bytes:
            async with sem:
                return await logs.segment_batches(lg, seg)

        # cached segments (most of them: the flush put them there) without a task each
        cached = [logs.reader.cached_data(lg, seg) for seg in run]
        loaded = iter(
            await asyncio.gather(*(fetch(s) for s, d in zip(run, cached, strict=True) if d is None))
        )
        datas = [next(loaded) if d is None else d for d in cached]
        built, data = await to_thread(
            _build_merged, run[0].base, datas, int(time.time() * 1000), self.config.index_interval
        )
        if built.last_offset != run[-1].last:
            raise ValueError(f"merged batches end at {built.last_offset}, not {run[-1].last}")
        if not self._current(lg):
            return False
        name = lg.new_object_name(run[0].base, built.last_offset)
        key = partition_prefix(self.config.namespace, lg.topic, lg.partition) + name
        # paced: a merge's megabytes never sit in the disk's queue ahead of a flush's PUT
        etag = await put_background(logs.store, key, [data], crc32c=built.crc32c)
        merged = SegmentMeta(
            run[0].base,
            built.last_offset,
            built.size,
            built.record_count,
            built.max_timestamp,
            etag,
            name,
            max(s.created_ms for s in run),
            version=built.version,
        )
        faults.checkpoint("merge.before_commit")
        if not await self._commit_merge(lg, run, merged):
            return False
        logs.cache.put(key, data, built.entries, etag)
        if self._current(lg):
            self.deleter.retire(lg, run)
        self.stats["merges"] += 1
        self.stats["merged_segments"] += len(run)
        self.stats["merged_bytes"] += built.size
        log.debug("merged %d segments of %s-%d into %s", len(run), lg.topic, lg.partition, name)
        return True

    async def _commit_merge(
        self, lg: PartitionLog, run: list[SegmentMeta], merged: SegmentMeta
    ) -> bool:
        """Commit the merge; the merged object is deleted only when it is certain never to
        be committed and this broker still owns the partition."""
        logs = self.logs
        async with logs.committer.lock:
            ids = {id(s) for s in run}
            if not self._current(lg) or sum(id(s) in ids for s in lg.segments) != len(run):
                if self._current(lg):  # our own run changed under us: never sent
                    await logs.discard(lg, [logs.object_key(lg, merged)])
                return False
            t, p = lg.topic, lg.partition
            entry = seg_entry_key(t, p, merged.base)
            ops: list[Put | Delete] = [Delete(seg_entry_key(t, p, s.base)) for s in run[1:]]
            ops.append(Put(entry, merged.to_json()))
            res = await logs.committer.commit([lg], ops, {entry: merged.to_json()}, moves_end=False)
            if res.outcome is Outcome.COMMITTED:
                first = run[0]
                lg.set_segments(
                    [
                        merged if s is first else s
                        for s in lg.segments
                        if s is first or id(s) not in ids
                    ]
                )
                if res.fenced:
                    logs.drop(lg, "fenced after its merge committed")
                return True
            if res.outcome is Outcome.UNKNOWN:
                logs.drop(lg, "a merge commit has an unknown outcome")
            elif res.fenced or not res.resolved:
                logs.drop(lg, "fenced (merge)")
            else:
                await logs.discard(lg, [logs.object_key(lg, merged)])
            return False
