"""Log maintenance on the partition owner: small-segment merging, retention, log start.

Every flush cycle writes one segment per active partition, so a partition at low
throughput gathers many tiny segments (objects and manifest keys). The owner's
maintenance task runs between flush cycles, on the event loop, and:

- **merges** runs of consecutive committed segments that are each smaller than
  ``merge_small_bytes`` and at least ``merge_min_age_ms`` old into ONE segment (batches
  byte for byte) written under a writer-unique name, then commits one transaction per run
  that deletes the run's manifest entries and puts the merged entry (with a ``key`` field
  naming the object) at the run's base (``broker.merging``, which skips a partition
  with nothing new since its last look);
- enforces ``retention.ms`` / ``retention.bytes`` by dropping whole segments from the
  head of the log (never the last one);
- advances the log start for DeleteRecords (``delete_records``), which may lie inside a
  segment: the end key keeps it (``log_start``);
- forgets idempotent producers that have not written for ``producer_id_expiration_ms``
  (Kafka's ``producer.id.expiration.ms``), except one with an open transaction or a
  batch not committed yet, every ``producer_id_expiration_check_interval_ms``; their
  snapshot is then rewritten without them;
- writes the partition's producer snapshot when one is due (``broker.producer_snapshot``).

Every transaction goes through the ``Committer`` (``broker.commit``): under its lock (so
it never races a flush commit), guarded like a flush commit, with an unknown outcome
resolved before anything depends on it. In-memory state changes only after success.
Objects leave through the ``ObjectDeleter`` (``broker.deletion``): retired ones after the
grace period, unreferenced ones by a new owner's sweep. One partition's failure is
logged once per cause and retried with back-off; the other partitions go on.
See docs/format.md, "Merged segments and the log start" and "Deleting objects".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker import producer_snapshot
from broker.commit import Outcome
from broker.compaction import Compactor
from broker.deletion import ObjectDeleter
from broker.maintenance_policy import retention_of, retention_victims
from broker.merging import Merger
from broker.meta.base import Delete, Put
from broker.meta.schema import end_key, seg_entry_key
from broker.partition import ACTIVE, PartitionLog, SegmentMeta
from broker.tasks import cancel_and_wait
from broker.turns import PAUSE_S, TurnBudget
from broker.txn_partition import state_of
from protocol.errors import ErrorCode, KafkaProtocolError

if TYPE_CHECKING:
    from broker.logs import LogManager

log = logging.getLogger(__name__)

STOP_WAIT_S = 10.0  # how long stop() lets a maintenance pass finish before cancelling it
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 300.0


# ---------------------------------------------------------------------------- the task


@dataclass(slots=True)
class _Failure:
    cause: str
    retry_at: float
    backoff: float


class Maintenance:
    """Started and stopped by the ``LogManager``; tests drive ``run_once``."""

    def __init__(self, logs: LogManager) -> None:
        self.logs = logs
        self.config = logs.config
        self.deleter = ObjectDeleter(logs)
        self.compactor = Compactor(logs, self.deleter)
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._sweeps: dict[tuple[str, int], tuple[float, PartitionLog]] = {}  # due, log
        self._failures: dict[tuple[str, int], _Failure] = {}
        self._next_retention = 0.0
        self._next_expiry = 0.0
        self.stats = {
            "merges": 0,
            "merged_segments": 0,
            "merged_bytes": 0,
            "dropped_segments": 0,
            "deleted": 0,
            "failures": 0,
            "reclaimed_bytes": 0,
            "expired_producers": 0,
            "merge_plans": 0,
        }
        self.merger = Merger(logs, self.deleter, self.stats, self._current)

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
                await cancel_and_wait(self._task)
            self._task = None
        await self.deleter.stop()

    @property
    def pending_deletes(self) -> frozenset[str]:
        return self.deleter.pending

    def acquired(self, lg: PartitionLog) -> None:
        """A new owner: sweep objects an earlier owner left behind, after the grace."""
        due = asyncio.get_running_loop().time() + self.config.segment_delete_grace_ms / 1000
        self._sweeps[(lg.topic, lg.partition)] = (due, lg)

    def forget(self, lg: PartitionLog) -> None:
        """``lg`` is no longer this broker's: no sweep, merge or deletion of it runs."""
        tp = (lg.topic, lg.partition)
        if tp in self._sweeps and self._sweeps[tp][1] is lg:
            del self._sweeps[tp]
        self.merger.forget(lg)
        self.deleter.forget(lg)
        self.compactor.forget(lg)

    async def flush_deletes(self) -> None:
        """Run every scheduled deletion now and wait for it (tests, tooling)."""
        await self.deleter.flush()
        self.stats["deleted"] = self.deleter.stats["deleted"]

    async def sweep(self, lg: PartitionLog) -> int:
        return await self.deleter.sweep(lg)

    def _interval(self) -> float:
        ivals = [
            ms / 1000
            for ms in (
                self.config.merge_interval_ms,
                self.config.retention_check_interval_ms,
                self.config.producer_id_expiration_check_interval_ms,
            )
            if ms > 0
        ]
        return min(ivals) if ivals else 1.0

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval()):
                    await self._stopping.wait()
            if self._stopping.is_set():
                return
            try:
                await self.run_once()
            except Exception:  # never let maintenance die
                log.exception("log maintenance pass failed")

    async def run_once(
        self, *, force_retention: bool = False, expire_at_ms: int | None = None
    ) -> None:
        """One pass: due sweeps, merges, and (when due) retention and producer expiry,
        for every owned log. ``expire_at_ms``: run the expiry now, as if the wall clock
        read that (tests). Nothing runs while this broker's lease is in doubt."""
        if not self.logs.cluster.lease_valid():
            return
        cfg = self.config
        now = asyncio.get_running_loop().time()
        retention = cfg.retention_check_interval_ms > 0 and (
            force_retention or now >= self._next_retention
        )
        if retention:
            self._next_retention = now + cfg.retention_check_interval_ms / 1000
        expiry: int | None = None  # producers that last wrote before this are forgotten
        if cfg.producer_id_expiration_ms > 0 and cfg.producer_id_expiration_check_interval_ms > 0:
            if expire_at_ms is not None or now >= self._next_expiry:
                self._next_expiry = now + cfg.producer_id_expiration_check_interval_ms / 1000
                wall = int(time.time() * 1000) if expire_at_ms is None else expire_at_ms
                expiry = wall - cfg.producer_id_expiration_ms
        for tp, (due, lg) in list(self._sweeps.items()):
            if not self._current(lg):
                self._sweeps.pop(tp, None)
            elif now >= due and self._may_run(lg, now):
                self._sweeps.pop(tp, None)
                await self._guarded(lg, self.deleter.sweep(lg))
        periodic = retention or expiry is not None
        mono = time.monotonic()  # the merges' clock
        turn = TurnBudget()  # 4,000 idle partitions held the loop ~20 ms (broker/turns.py)
        for lg in list(self.logs.logs.values()):
            if turn.due():
                await asyncio.sleep(PAUSE_S)  # each partition is looked at again below (_current)
            if self._stopping.is_set():
                return
            if not self._current(lg) or not self._may_run(lg, now):
                continue
            if not periodic and self._idle(lg, mono):
                continue
            await self._guarded(lg, self._maintain(lg, retention, expiry))
        live = set(self.logs.logs)
        self.merger.prune(live)
        for tp in [tp for tp in self._failures if tp not in live]:
            del self._failures[tp]
        self.stats["deleted"] = self.deleter.stats["deleted"]

    def _idle(self, lg: PartitionLog, mono: float) -> bool:
        """Whether ``_maintain`` would do nothing on ``lg`` now, by the same early exits
        each of its steps takes, without a coroutine: most owned partitions are idle at
        most passes, and ~5 us each was 20 ms a second at 4,000 (docs/benchmarks.md,
        "Round 21"). A partition whose last step failed is not skipped."""
        if (lg.topic, lg.partition) in self._failures:
            return False
        if self.config.merge_interval_ms > 0 and not self.merger.quiet(lg, mono):
            return False
        return self.compactor.idle(lg) and not producer_snapshot.due(lg)

    async def _maintain(self, lg: PartitionLog, retention: bool, expiry: int | None) -> None:
        if retention:
            await self.apply_retention(lg)
        if self.config.merge_interval_ms > 0 and self._current(lg):
            await self.merge_partition(lg)
        if self._current(lg):
            await self.compactor.maybe_compact(lg)
        if expiry is not None and self._current(lg):
            await self.expire_producers(lg, expiry)
        if self._current(lg) and producer_snapshot.due(lg):
            await producer_snapshot.write(self.logs.meta, lg)

    async def expire_producers(self, lg: PartitionLog, before_ms: int) -> list[int]:
        """Forget ``lg``'s producers that last wrote before ``before_ms`` (Kafka's
        producer.id.expiration.ms), except those with a transaction open on it, and
        what the partition keeps of their ended transactions (the epoch of their last
        marker: the transaction coordinator still fences an older epoch); the snapshot
        is then due, so the next owner does not bring them back."""
        if not lg.producers.idle(before_ms):
            return []
        txns = await state_of(self.logs.meta, lg)  # loaded once per owner
        if not self._current(lg):
            return []
        gone = lg.producers.expire(before_ms, txns.open)
        for pid in gone:  # its last markers go with it (the coordinator still fences)
            txns.fenced.pop(pid, None)
            txns.closed.pop(pid, None)
        if gone:
            self.stats["expired_producers"] += len(gone)
            if lg.snapshot_upto != -1:
                lg.snapshot_upto = -2  # rewrite it without them
            log.info("%s-%d: %d idle producer id(s) expired", lg.topic, lg.partition, len(gone))
        return gone

    def _may_run(self, lg: PartitionLog, now: float) -> bool:
        failure = self._failures.get((lg.topic, lg.partition))
        return failure is None or now >= failure.retry_at

    async def _guarded(self, lg: PartitionLog, work: Awaitable[object]) -> None:
        """Run one partition's work; a failure is logged once per distinct cause and the
        partition is retried with back-off, while the pass goes on with the others."""
        tp = (lg.topic, lg.partition)
        try:
            await work
        except Exception as exc:  # one partition's fault stays its own
            self.stats["failures"] += 1
            cause = f"{type(exc).__name__}: {exc}"
            prev = self._failures.get(tp)
            backoff = BACKOFF_FIRST_S if prev is None else min(prev.backoff * 2, BACKOFF_MAX_S)
            if prev is None or prev.cause != cause:
                log.warning(
                    "maintenance of %s-%d failed (retrying with back-off): %s",
                    lg.topic,
                    lg.partition,
                    cause,
                )
            now = asyncio.get_running_loop().time()
            self._failures[tp] = _Failure(cause, now + backoff, backoff)
        else:
            self._failures.pop(tp, None)

    def _current(self, lg: PartitionLog) -> bool:
        return lg.state == ACTIVE and self.logs.logs.get((lg.topic, lg.partition)) is lg

    async def merge_partition(self, lg: PartitionLog, now: float | None = None) -> int:
        """Merge every eligible run of small segments of ``lg`` now (``broker.merging``);
        returns the runs merged."""
        return await self.merger.merge_partition(lg, now)

    # -- head truncation: retention and DeleteRecords ---------------------------------------
    async def apply_retention(self, lg: PartitionLog, now_ms: int | None = None) -> int:
        """Drop head segments past ``retention.ms`` / ``retention.bytes``; returns how many."""
        info = self.logs.topics.get(lg.topic)
        if info is None:
            return 0
        limits = self.logs.topics.derived(info, retention_of)
        if limits is None:
            return 0
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        n = retention_victims(lg.segments, now_ms, *limits)
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
                self.deleter.retire(lg, dropped)
                self.stats["dropped_segments"] += len(dropped)
                self.stats["reclaimed_bytes"] += sum(s.size for s in dropped)
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
        logs = self.logs
        t, p = lg.topic, lg.partition
        end = lg.end_at(lg.hw, start)  # folded first (Committer.commit): hw is the end
        ops: list[Put | Delete] = [Delete(seg_entry_key(t, p, s.base)) for s in chunk]
        ops.append(Put(end_key(t, p), end))
        res = await logs.committer.commit([lg], ops, {end_key(t, p): end}, moves_end=True)
        if res.outcome is Outcome.COMMITTED:
            lg.end_rev = res.revision
            ids = {id(s) for s in chunk}
            lg.set_segments([s for s in lg.segments if id(s) not in ids], start)
            if res.fenced:
                logs.drop(lg, "fenced after its log start moved")
            return
        if res.outcome is Outcome.UNKNOWN:
            logs.drop(lg, "a log start commit has an unknown outcome")
            raise KafkaProtocolError(ErrorCode.KAFKA_STORAGE_ERROR)
        if res.fenced or not res.resolved:
            logs.drop(lg, "fenced (log start)")
            raise KafkaProtocolError(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        raise KafkaProtocolError(ErrorCode.KAFKA_STORAGE_ERROR)
