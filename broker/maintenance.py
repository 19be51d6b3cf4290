"""Log maintenance on the partition owner: small-segment merging, retention, log start.

Every flush cycle writes one segment per active partition, so a partition at low
throughput gathers many tiny segments (objects and manifest keys). The owner's
maintenance task runs between flush cycles, on the event loop, and:

- **merges** runs of consecutive committed segments that are each smaller than
  ``merge_small_bytes`` and at least ``merge_min_age_ms`` old into ONE segment (batches
  byte for byte) written under ``segment-{base:020d}-{last:020d}.kfs`` (+ ``.index``),
  then commits one transaction per run that deletes the run's manifest entries and puts
  the merged entry (with a ``key`` field naming the object) at the run's base;
- enforces ``retention.ms`` / ``retention.bytes`` by dropping whole segments from the
  head of the log (never the last one);
- advances the log start for DeleteRecords (``delete_records``), which may lie inside a
  segment: the end key keeps it (``log_start``).

Every transaction runs under ``LogManager.commit_lock`` (so it never races a flush
commit) and compares the owner key value and the end key's mod revision, exactly like a
flush commit. In-memory state changes only after success. Objects no longer named by the
manifest are deleted ``segment_delete_grace_ms`` later (readers holding an old
``SegmentMeta`` may still read them); a new owner sweeps objects an earlier owner left
behind (same grace) — see docs/format.md, "Merged segments and the log start".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from broker.logs import _end_key, _owner_key, _seg_entry_key, end_json
from broker.meta.base import Compare, Delete, MetaStoreError, Put
from broker.partition import ACTIVE, PartitionLog, SegmentMeta
from protocol.errors import ErrorCode, KafkaProtocolError
from segments.format import (
    INDEX_SUFFIX,
    SEGMENT_SUFFIX,
    build_segment,
    index_key_for,
    iter_segment_batches,
    parse_index,
    partition_prefix,
)
from segments.store import StoreError

if TYPE_CHECKING:
    from broker.logs import LogManager

log = logging.getLogger(__name__)

STOP_WAIT_S = 10.0  # how long stop() lets a maintenance pass finish before cancelling it


# ---------------------------------------------------------------------------- pure policy


def merged_name(base: int, last: int) -> str:
    """Object name (under ``{ns}/{t}/{p}/``) of a merged segment."""
    return f"segment-{base:020d}-{last:020d}{SEGMENT_SUFFIX}"


def parse_object_name(name: str) -> tuple[int, int | None] | None:
    """(base, last or None) of ``segment-{base}[-{last}].kfs|.index``; None otherwise."""
    for suffix in (SEGMENT_SUFFIX, INDEX_SUFFIX):
        if name.startswith("segment-") and name.endswith(suffix):
            parts = name[len("segment-") : -len(suffix)].split("-")
            if all(len(p) == 20 and p.isdigit() for p in parts) and len(parts) in (1, 2):
                return int(parts[0]), int(parts[1]) if len(parts) == 2 else None
    return None


def plan_merges(
    segments: Sequence[SegmentMeta],
    eligible: Callable[[SegmentMeta], bool],
    small_bytes: int,
    max_bytes: int,
    min_count: int,
    max_count: int,
) -> list[list[SegmentMeta]]:
    """Runs of consecutive, contiguous, eligible segments each below ``small_bytes``; a
    run holds at most ``max_count`` segments and ``max_bytes`` bytes, at least
    ``max(2, min_count)`` segments."""
    runs: list[list[SegmentMeta]] = []
    cur: list[SegmentMeta] = []
    size = 0
    need = max(2, min_count)

    def close() -> None:
        if len(cur) >= need:
            runs.append(list(cur))
        cur.clear()

    for seg in segments:
        if seg.size >= small_bytes or not eligible(seg):
            close()
            size = 0
            continue
        if cur and (
            seg.base != cur[-1].last + 1 or len(cur) >= max_count or size + seg.size > max_bytes
        ):
            close()
            size = 0
        cur.append(seg)
        size += seg.size
    close()
    return runs


def retention_victims(
    segments: Sequence[SegmentMeta], now_ms: int, retention_ms: int, retention_bytes: int
) -> int:
    """How many segments to drop from the head (never the last one), as Kafka does: while
    the head segment's max timestamp — and its write time: our segments are small, so a
    record with an old timestamp must not go the moment it lands — is older than
    ``retention_ms``, or while dropping it
    leaves the partition at least ``retention_bytes`` big (-1: no limit)."""
    total = sum(s.size for s in segments)
    n = 0
    for seg in segments[:-1]:
        by_time = retention_ms >= 0 and 0 <= seg.retention_ts < now_ms - retention_ms
        by_size = retention_bytes >= 0 and total - seg.size >= retention_bytes
        if not (by_time or by_size):
            break
        total -= seg.size
        n += 1
    return n


# ---------------------------------------------------------------------------- the task


class Maintenance:
    """Started and stopped by the ``LogManager``; tests drive ``run_once``."""

    def __init__(self, logs: LogManager) -> None:
        self.logs = logs
        self.config = logs.config
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._seen: dict[tuple[str, int], dict[int, float]] = {}  # first seen per base
        # object key -> (deletion timer, topic, topic id when it left the manifest)
        self._deletes: dict[str, tuple[asyncio.TimerHandle, str, uuid.UUID]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweeps: dict[tuple[str, int], float] = {}  # partition -> loop time due
        self._next_retention = 0.0
        self.stats = {"merges": 0, "merged_segments": 0, "dropped_segments": 0, "deleted": 0}

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="log-maintenance")

    async def stop(self) -> None:
        """Stop the loop (a pass in progress finishes its transaction first); pending
        deletions are left to the next owner's sweep."""
        self._stopping.set()
        if self._task is not None:
            done, _ = await asyncio.wait([self._task], timeout=STOP_WAIT_S)
            if not done:
                self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for handle, _topic, _tid in self._deletes.values():
            handle.cancel()
        self._deletes.clear()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks))

    @property
    def pending_deletes(self) -> frozenset[str]:
        return frozenset(self._deletes)

    def acquired(self, lg: PartitionLog) -> None:
        """A new owner: sweep objects an earlier owner left behind, after the grace."""
        due = asyncio.get_running_loop().time() + self.config.segment_delete_grace_ms / 1000
        self._sweeps[(lg.topic, lg.partition)] = due

    def _interval(self) -> float:
        ivals = [
            ms / 1000
            for ms in (self.config.merge_interval_ms, self.config.retention_check_interval_ms)
            if ms > 0
        ]
        return min(ivals) if ivals else 1.0

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self._interval())
            if self._stopping.is_set():
                return
            try:
                await self.run_once()
            except Exception:  # never let maintenance die
                log.exception("log maintenance pass failed")

    async def run_once(self, *, force_retention: bool = False) -> None:
        """One pass: due sweeps, merges, and (when due) retention, for every owned log."""
        now = asyncio.get_running_loop().time()
        retention = self.config.retention_check_interval_ms > 0 and (
            force_retention or now >= self._next_retention
        )
        if retention:
            self._next_retention = now + self.config.retention_check_interval_ms / 1000
        for tp, due in list(self._sweeps.items()):
            lg = self.logs.logs.get(tp)
            if lg is None or lg.state != ACTIVE:
                self._sweeps.pop(tp, None)
            elif now >= due:
                self._sweeps.pop(tp, None)
                await self.sweep(lg)
        for lg in list(self.logs.logs.values()):
            if self._stopping.is_set():
                return
            if not self._current(lg):
                continue
            if retention:
                await self.apply_retention(lg)
            if self.config.merge_interval_ms > 0:
                await self.merge_partition(lg)
        live = set(self.logs.logs)
        for tp in [tp for tp in self._seen if tp not in live]:
            del self._seen[tp]

    def _current(self, lg: PartitionLog) -> bool:
        return lg.state == ACTIVE and self.logs.logs.get((lg.topic, lg.partition)) is lg

    def _fence(self, lg: PartitionLog) -> list[Compare]:
        return [
            Compare(_owner_key(lg.topic, lg.partition), "value", "==", lg.owner_value),
            Compare(_end_key(lg.topic, lg.partition), "mod_revision", "==", lg.end_rev),
        ]

    # -- merging --------------------------------------------------------------------------
    async def merge_partition(self, lg: PartitionLog) -> int:
        """Merge every eligible run of small segments of ``lg``; returns runs merged."""
        cfg = self.config
        now = time.monotonic()
        tp = (lg.topic, lg.partition)
        old = self._seen.get(tp, {})
        seen = {b: old.get(b, now) for b in lg.bases}
        self._seen[tp] = seen
        min_age = cfg.merge_min_age_ms / 1000
        runs = plan_merges(
            lg.segments,
            lambda s: now - seen.get(s.base, now) >= min_age and s.last >= lg.log_start,
            cfg.merge_small_bytes,
            cfg.merge_max_bytes,
            cfg.merge_min_segments,
            max(2, self.logs.meta.max_txn_ops - 1),
        )
        done = 0
        for run in runs:
            try:
                if await self._merge_run(lg, run):
                    done += 1
            except (StoreError, ValueError) as exc:
                log.warning(
                    "merge of %s-%d [%d..%d] skipped: %s",
                    lg.topic,
                    lg.partition,
                    run[0].base,
                    run[-1].last,
                    exc,
                )
            if not self._current(lg):
                break
        return done

    async def _merge_run(self, lg: PartitionLog, run: list[SegmentMeta]) -> bool:
        logs = self.logs
        sem = asyncio.Semaphore(self.config.flush_concurrency)

        async def fetch(seg: SegmentMeta) -> bytes:
            async with sem:
                return await logs.segment_batches(lg, seg)

        datas = await asyncio.gather(*(fetch(seg) for seg in run))
        views = [view for data in datas for _pos, _hdr, view in iter_segment_batches(data)]
        built = build_segment(
            run[0].base, views, int(time.time() * 1000), self.config.index_interval
        )
        if built.last_offset != run[-1].last:
            raise ValueError(f"merged batches end at {built.last_offset}, not {run[-1].last}")
        name = merged_name(run[0].base, built.last_offset)
        key = partition_prefix(self.config.namespace, lg.topic, lg.partition) + name
        data = b"".join(built.buffers)
        await logs._put_fresh(index_key_for(key), built.index, lg)
        etag = await logs._put_fresh(key, data, lg)
        merged = SegmentMeta(
            run[0].base,
            built.last_offset,
            built.size,
            built.record_count,
            built.max_timestamp,
            etag,
            name,
            max(s.created_ms for s in run),
        )
        if not await self._commit_merge(lg, run, merged):
            return False
        logs.cache.put(key, data, parse_index(built.index), etag)
        self._retire(lg, run)
        self.stats["merges"] += 1
        self.stats["merged_segments"] += len(run)
        log.debug("merged %d segments of %s-%d into %s", len(run), lg.topic, lg.partition, name)
        return True

    async def _commit_merge(
        self, lg: PartitionLog, run: list[SegmentMeta], merged: SegmentMeta
    ) -> bool:
        key = self.logs.object_key(lg, merged)
        outcome = await self._merge_txn(lg, run, merged)
        if outcome is False:  # certainly not committed: the merged object is garbage
            await self._delete_now([key, index_key_for(key)])
        return outcome is True

    async def _merge_txn(
        self, lg: PartitionLog, run: list[SegmentMeta], merged: SegmentMeta
    ) -> bool | None:
        """True: committed; False: not committed; None: unknown (store error)."""
        async with self.logs.commit_lock:
            ids = {id(s) for s in run}
            if not self._current(lg) or sum(id(s) in ids for s in lg.segments) != len(run):
                return False
            t, p = lg.topic, lg.partition
            ops: list[Put | Delete] = [Delete(_seg_entry_key(t, p, s.base)) for s in run[1:]]
            ops.append(Put(_seg_entry_key(t, p, merged.base), merged.to_json()))
            try:
                res = await self.logs.meta.txn(self._fence(lg), ops)
            except MetaStoreError as exc:  # outcome unknown: the next sweep decides
                log.warning("merge commit of %s-%d failed: %s", t, p, exc)
                return None
            if not res.succeeded:
                log.warning("merge commit of %s-%d fenced", t, p)
                return False
            first = run[0]
            lg.set_segments(
                [merged if s is first else s for s in lg.segments if s is first or id(s) not in ids]
            )
        return True

    # -- head truncation: retention and DeleteRecords ---------------------------------------
    async def apply_retention(self, lg: PartitionLog, now_ms: int | None = None) -> int:
        """Drop head segments past ``retention.ms`` / ``retention.bytes``; returns how many."""
        info = self.logs.topics.get(lg.topic)
        if info is None:
            return 0
        cfg = self.logs.topics.effective_configs(info)
        if "delete" not in cfg.get("cleanup.policy", "delete"):
            return 0
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        n = retention_victims(
            lg.segments,
            now_ms,
            int(cfg.get("retention.ms", "-1")),
            int(cfg.get("retention.bytes", "-1")),
        )
        if n == 0:
            return 0
        try:
            return await self.truncate_head(lg, lg.segments[n].base)
        except KafkaProtocolError as exc:
            log.warning("retention of %s-%d failed: %s", lg.topic, lg.partition, exc)
            return 0

    async def delete_records(self, lg: PartitionLog, offset: int) -> int:
        """DeleteRecords: move the log start to ``offset`` (-1: the high watermark);
        returns the new low watermark. Raises KafkaProtocolError."""
        if offset == -1:
            offset = lg.hw
        if offset < 0 or offset > lg.hw:
            raise KafkaProtocolError(ErrorCode.OFFSET_OUT_OF_RANGE)
        await self.truncate_head(lg, offset)
        return lg.log_start

    async def truncate_head(self, lg: PartitionLog, new_start: int) -> int:
        """Advance the log start to ``new_start`` (at most the high watermark), dropping
        every segment wholly below it; returns the number of segments dropped."""
        dropped: list[SegmentMeta] = []
        try:
            async with self.logs.commit_lock:
                new_start = min(new_start, lg.hw)
                while self._current(lg) and new_start > lg.log_start:
                    chunk = [s for s in lg.segments if s.last < new_start]
                    chunk = chunk[: max(1, self.logs.meta.max_txn_ops - 1)]
                    start = new_start
                    if len(chunk) < len([s for s in lg.segments if s.last < new_start]):
                        start = chunk[-1].last + 1
                    await self._commit_truncate(lg, chunk, start)
                    dropped += chunk
                if not self._current(lg):
                    raise KafkaProtocolError(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        finally:
            if dropped:
                self._retire(lg, dropped)
                self.stats["dropped_segments"] += len(dropped)
                log.info(
                    "log start of %s-%d is now %d (%d segments dropped)",
                    lg.topic,
                    lg.partition,
                    lg.log_start,
                    len(dropped),
                )
        return len(dropped)

    async def _commit_truncate(
        self, lg: PartitionLog, chunk: list[SegmentMeta], start: int
    ) -> None:
        t, p = lg.topic, lg.partition
        ops: list[Put | Delete] = [Delete(_seg_entry_key(t, p, s.base)) for s in chunk]
        ops.append(Put(_end_key(t, p), end_json(lg.hw, lg.epoch, start)))
        try:
            res = await self.logs.meta.txn(self._fence(lg), ops)
        except MetaStoreError as exc:
            log.warning("log start commit of %s-%d failed: %s", t, p, exc)
            raise KafkaProtocolError(ErrorCode.KAFKA_STORAGE_ERROR) from exc
        if not res.succeeded:
            raise KafkaProtocolError(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        lg.end_rev = res.revision
        ids = {id(s) for s in chunk}
        lg.set_segments([s for s in lg.segments if id(s) not in ids], start)

    # -- deleting objects -----------------------------------------------------------------
    def _retire(self, lg: PartitionLog, segs: list[SegmentMeta]) -> None:
        """Schedule the objects of segments no longer in the manifest for deletion."""
        loop = asyncio.get_running_loop()
        grace = max(0, self.config.segment_delete_grace_ms) / 1000
        for seg in segs:
            key = self.logs.object_key(lg, seg)
            self.logs.cache.evict(key)  # readers that already hold it keep their reference
            for k in (key, index_key_for(key)):
                if k not in self._deletes:
                    handle = loop.call_later(grace, self._spawn_delete, k)
                    self._deletes[k] = (handle, lg.topic, lg.topic_id)

    async def flush_deletes(self) -> None:
        """Run every scheduled deletion now and wait for it (tests, tooling)."""
        pending, self._deletes = self._deletes, {}
        for handle, _topic, _tid in pending.values():
            handle.cancel()
        await self._delete_now([k for k, (_h, t, tid) in pending.items() if self._same(t, tid)])
        if self._tasks:
            await asyncio.wait(list(self._tasks))

    def _same(self, topic: str, topic_id: uuid.UUID) -> bool:
        """Still the topic the object belonged to? (Deleting a topic removes its objects;
        a topic re-created under the name reuses the keys, which must then be left alone.)"""
        info = self.logs.topics.get(topic)
        return info is not None and info.topic_id == topic_id

    def _spawn_delete(self, key: str) -> None:
        task = asyncio.create_task(self._delete_later(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _delete_later(self, key: str) -> None:
        entry = self._deletes.get(key)
        try:
            if entry is not None and self._same(entry[1], entry[2]):
                await self._delete_now([key])
        finally:
            self._deletes.pop(key, None)

    async def _delete_now(self, keys: list[str]) -> None:
        for key in keys:
            try:
                await self.logs.store.delete(key)
                self.logs.cache.evict(key)
                self.stats["deleted"] += 1
            except StoreError as exc:  # left for the next owner's sweep
                log.warning("could not delete %s: %s", key, exc)

    async def sweep(self, lg: PartitionLog) -> int:
        """Delete objects of ``lg`` below its committed end that no manifest entry names
        (left by an earlier owner: deletions it did not live to run, uncommitted merges).
        Runs in the maintenance task, so no merge of this broker is in flight."""
        hw = lg.hw
        prefix = partition_prefix(self.config.namespace, lg.topic, lg.partition)
        try:
            infos = await self.logs.store.list(prefix)
        except StoreError as exc:
            log.warning("sweep of %s-%d skipped: %s", lg.topic, lg.partition, exc)
            return 0
        named: set[str] = set(self._deletes)
        for seg in lg.segments:
            key = self.logs.object_key(lg, seg)
            named.update((key, index_key_for(key)))
        garbage = []
        for info in infos:
            parsed = parse_object_name(info.key[len(prefix) :])
            # a plain key at or past the end may be a flush upload in flight
            if parsed is None or info.key in named or (parsed[1] is None and parsed[0] >= hw):
                continue
            garbage.append(info.key)
        if garbage:
            log.info(
                "sweeping %d unreferenced objects of %s-%d", len(garbage), lg.topic, lg.partition
            )
            await self._delete_now(garbage)
        return len(garbage)
