"""One partition owned by this broker: offsets, the open buffer, the committed manifest.

Offsets are assigned in memory at append time; the batch's ``baseOffset`` and
``partitionLeaderEpoch`` are patched in place (outside the CRC). Appended batches wait in
``pending`` until the log manager's flush cycle writes them as a segment and commits the
manifest entry; only then does ``hw`` (the high watermark = committed log end) move and
the append futures resolve (docs/architecture.md, the write path).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from bisect import bisect_right
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker.meta.schema import SegmentMeta, end_json
from broker.producers import INT32_MAX, BatchRecord, ProducerState
from protocol.batch import BatchHeader, patch_batch
from protocol.errors import ErrorCode
from protocol.values import value
from segments.names import tagged_object_name, topic_tag

if TYPE_CHECKING:
    from broker.txn_partition import PartitionTxns

ACTIVE = "active"
RELEASING = "releasing"
CLOSED = "closed"


@dataclass(slots=True)
class PendingBatch:
    header: BatchHeader
    view: memoryview
    base_offset: int
    future: asyncio.Future[None]


@value
class AppendResult:
    error: ErrorCode
    base_offset: int = -1
    done: asyncio.Future[None] | None = None  # resolves when committed


def last_sequence(first_seq: int, delta: int) -> int:
    """The batch's last sequence number (sequences wrap at INT32_MAX)."""
    last = first_seq + delta
    return last - INT32_MAX - 1 if last > INT32_MAX else last


class PartitionLog:
    __slots__ = (
        "topic",
        "partition",
        "topic_id",
        "topic_hex",
        "topic_tag",
        "epoch",
        "owner_value",
        "end_rev",
        "next_offset",
        "hw",
        "log_start",
        "segments",
        "bases",
        "pending",
        "pending_bytes",
        "pending_since",
        "producers",
        "waiters",
        "state",
        "flushing",
        "epochs",
        "object_seq",
        "txns",
        "snapshot_upto",
        "owner_broker",
        "owner_reg",
        "folded",
        "unfolded",
        "changes",
    )

    def __init__(
        self,
        topic: str,
        partition: int,
        topic_id: uuid.UUID,
        epoch: int,
        owner_value: bytes,
        end_rev: int,
        next_offset: int,
        segments: list[SegmentMeta],
        epochs: list[tuple[int, int]],
        log_start: int = 0,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.topic_id = topic_id
        self.topic_hex = topic_id.hex  # kept: asked per segment (names, cycle entries)
        self.topic_tag = topic_tag(topic_id)
        self.epoch = epoch
        self.owner_value = owner_value
        self.end_rev = end_rev
        self.next_offset = next_offset
        self.hw = next_offset
        self.segments = segments
        self.bases = [s.base for s in segments]
        first = segments[0].base if segments else next_offset
        # a DeleteRecords log start may lie inside the first segment (kept in the end key)
        self.log_start = min(max(log_start, first), next_offset)
        self.pending: list[PendingBatch] = []
        self.pending_bytes = 0
        self.pending_since = 0.0
        self.producers = ProducerState()
        self.waiters: list[asyncio.Future[None]] = []
        self.state = ACTIVE
        self.flushing: asyncio.Future[None] | None = None
        self.epochs = epochs  # [(epoch, start_offset)] ascending
        self.object_seq = 0  # numbers this owner's objects: names are never reused
        self.txns: PartitionTxns | None = None  # broker.txn_partition, loaded on first use
        # offset of the persisted producer snapshot (broker.producer_snapshot); -1 none,
        # -2 one that must be rewritten
        self.snapshot_upto = -1
        # an owner that commits through cycle keys (broker/fold.py) names itself in the end
        # value: its node id and registration revision (-1, 0: it does not)
        self.owner_broker = -1
        self.owner_reg = 0
        # the log end the partition's own keys hold; past it, segments committed in cycle
        # keys and not folded yet, each with its cycle key (in offset order)
        self.folded = next_offset
        self.unfolded: list[tuple[SegmentMeta, str]] = []
        # counts the changes of ``segments`` (a commit appends, a merge or a truncation
        # swaps the list): maintenance skips a partition none happened to since its last look
        self.changes = 0

    def new_object_name(self, base: int, last: int) -> str:
        """A writer-unique object name for a segment this owner writes (docs/format.md)."""
        self.object_seq += 1
        return tagged_object_name(base, last, self.epoch, self.topic_tag, self.object_seq)

    def end_value(self) -> bytes:
        """The committed value of the end key, as this owner last wrote or read it."""
        return self.end_at(self.folded)

    def end_at(self, next_offset: int, log_start: int | None = None) -> bytes:
        """An end value of this owner (its epoch, and its names when it folds cycles)."""
        start = self.log_start if log_start is None else log_start
        return end_json(next_offset, self.epoch, start, self.owner_broker, self.owner_reg)

    # -- write side ---------------------------------------------------------------------
    def append(self, header: BatchHeader, view: memoryview) -> AppendResult:
        """Assign offsets to one validated v2 batch and buffer it (synchronous).

        ``header.crc`` must have been checked against the batch's bytes by this process
        (produce validation) or computed over them by it (control batches): the flush
        derives the segment's CRCs from it (``segments.writer.build_segment``)."""
        if self.state != ACTIVE:
            return AppendResult(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        pid, first_seq = header.producer_id, header.base_sequence
        idempotent = pid >= 0 and first_seq >= 0
        if idempotent:  # the one extra step of the idempotent path: a lookup per batch
            last_seq = last_sequence(first_seq, header.last_offset_delta)
            err, dup, entry = self.producers.admit(pid, header.producer_epoch, first_seq, last_seq)
            if err != ErrorCode.NONE:
                return AppendResult(err)
            if dup is not None:
                return AppendResult(ErrorCode.NONE, dup.base_offset, dup.done)
        base = self.next_offset
        patch_batch(view, base, header.batch_length, self.epoch)
        self.next_offset = base + header.last_offset_delta + 1
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        if not self.pending:
            self.pending_since = loop.time()
        self.pending.append(PendingBatch(header, view, base, fut))
        self.pending_bytes += len(view)
        if idempotent:
            batch = BatchRecord(first_seq, last_seq, base, fut)
            self.producers.track(pid, entry, header.producer_epoch, batch, int(time.time() * 1000))
        return AppendResult(ErrorCode.NONE, base, fut)

    def take_pending(self) -> list[PendingBatch]:
        pend, self.pending, self.pending_bytes = self.pending, [], 0
        return pend

    def committed(self, seg: SegmentMeta, revision: int, pend: list[PendingBatch]) -> None:
        """``seg`` committed to the partition's own keys (the end key now at ``revision``;
        anything in cycle keys was folded first: ``Committer.commit``)."""
        self._append_committed(seg, pend)
        self.end_rev = revision
        self.folded = self.hw

    def committed_in_cycle(self, seg: SegmentMeta, key: str, pend: list[PendingBatch]) -> None:
        """``seg`` committed in cycle key ``key``: acknowledged now, folded later."""
        self.unfolded.append((seg, key))
        self._append_committed(seg, pend)

    def folded_upto(self, count: int, revision: int) -> None:
        """The first ``count`` unfolded segments are in the partition's own keys now."""
        done, self.unfolded = self.unfolded[:count], self.unfolded[count:]
        if done:
            self.folded = done[-1][0].last + 1
        self.end_rev = revision

    def _append_committed(self, seg: SegmentMeta, pend: list[PendingBatch]) -> None:
        self.segments.append(seg)
        self.bases.append(seg.base)
        self.changes += 1
        self.hw = seg.last + 1
        for p in pend:
            if not p.future.done():
                p.future.set_result(None)
        self.wake_waiters()

    def set_segments(self, segments: list[SegmentMeta], log_start: int | None = None) -> None:
        """Swap in a new manifest after a merge or a head truncation. A new list, never
        an in-place edit: readers iterating the old one keep a consistent snapshot."""
        self.segments = segments
        self.bases = [s.base for s in segments]
        self.changes += 1
        if log_start is not None:
            self.log_start = log_start

    def failed(self, pend: list[PendingBatch], error: ErrorCode) -> None:
        """A flush of ``pend`` failed: fail it and everything appended after it, and
        rewind to the committed end so the producers' retries get fresh offsets."""
        later = self.take_pending()
        exc = _append_error(error)
        firsts: dict[int, tuple[int, int, int]] = {}
        for p in (*pend, *later):
            if not p.future.done():
                p.future.set_exception(exc)
                p.future.exception()  # mark retrieved: waiters may be gone
            h = p.header
            if h.producer_id >= 0 and h.base_sequence >= 0 and h.producer_id not in firsts:
                firsts[h.producer_id] = (h.producer_epoch, h.base_sequence, p.base_offset)
        self.next_offset = self.hw
        self.producers.rollback(self.hw, firsts)

    def close(self, error: ErrorCode) -> None:
        self.state = CLOSED
        self.failed([], error)
        self.wake_waiters()

    def wake_waiters(self) -> None:
        waiters, self.waiters = self.waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    # -- read side ----------------------------------------------------------------------
    def segment_index(self, offset: int) -> int:
        """Index into ``segments`` of the segment holding ``offset`` (-1 if none)."""
        return bisect_right(self.bases, offset) - 1

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(epoch, end offset) as OffsetForLeaderEpoch answers it."""
        if epoch >= self.epoch:
            return self.epoch, self.hw
        known = [e for e, _ in self.epochs if e <= epoch]
        if not known:
            return -1, -1
        found = max(known)
        later = [start for e, start in self.epochs if e > found]
        return found, min(later) if later else self.hw


class AppendError(Exception):
    def __init__(self, code: ErrorCode) -> None:
        super().__init__(code.name)
        self.code = code


def _append_error(code: ErrorCode) -> AppendError:
    return AppendError(code)
