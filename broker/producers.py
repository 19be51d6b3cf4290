"""Idempotent-producer state per partition (docs/architecture.md).

For every producer id the owner keeps the producer epoch and the last five batches'
sequence ranges with their offsets. A retried batch that matches one of them is a
duplicate: it is acknowledged with its original offset and not appended again. A batch
whose first sequence does not follow the last one is a gap: OUT_OF_ORDER_SEQUENCE_NUMBER.

A producer id this partition has no state for (state lost to retention, expired after
``producer.id.expiration.ms`` without a write, or older than the segments read at
takeover, ``broker.producer_rebuild``) is accepted at any sequence and tracked from
there, as Kafka does, instead of being rejected: a rejection would make idempotent
producers fail fatally after a restart. A failed flush never makes a producer unknown
(``rollback``). docs/architecture.md, "Idempotent producers".
"""

from __future__ import annotations

import asyncio
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field

from broker.meta.schema import SnapshotProducer
from protocol.errors import ErrorCode

MAX_TRACKED = 5
INT32_MAX = 2**31 - 1


@dataclass(slots=True)
class BatchRecord:
    first_seq: int
    last_seq: int
    base_offset: int
    done: asyncio.Future[None] | None  # resolved on commit; None once committed


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    # the last MAX_TRACKED, oldest first: a list, not a deque(maxlen=5), whose 760
    # bytes were half of what a producer cost (docs/benchmarks.md, "Round 9")
    batches: list[BatchRecord] = field(default_factory=list)
    last_ms: int = -1  # wall clock of its last append (ms); expiry counts from it

    def in_flight(self) -> bool:
        """Whether a batch of it is appended but not committed yet."""
        return any(b.done is not None and not b.done.done() for b in self.batches)


def _next_seq(seq: int) -> int:
    return 0 if seq == INT32_MAX else seq + 1


def classify(
    entry: ProducerEntry | None, epoch: int, first_seq: int, last_seq: int
) -> tuple[ErrorCode, BatchRecord | None]:
    """A batch against its producer's entry: (NONE, None) = append it; (NONE, record) =
    a duplicate of ``record``; otherwise the error to answer with."""
    if entry is None:
        return ErrorCode.NONE, None
    if epoch != entry.epoch:
        if epoch < entry.epoch:
            return ErrorCode.INVALID_PRODUCER_EPOCH, None
        return ErrorCode.NONE if first_seq == 0 else ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, None
    batches = entry.batches
    if not batches:
        return ErrorCode.NONE, None
    last = batches[-1]
    if first_seq == _next_seq(last.last_seq):  # the usual case: the next batch in order
        return ErrorCode.NONE, None
    for rec in batches:
        if rec.first_seq == first_seq and rec.last_seq == last_seq:
            return ErrorCode.NONE, rec
    return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, None


class ProducerState:
    """Sequence bookkeeping of one partition."""

    __slots__ = ("_producers",)

    def __init__(self) -> None:
        self._producers: dict[int, ProducerEntry] = {}

    def check(
        self, producer_id: int, epoch: int, first_seq: int, last_seq: int
    ) -> tuple[ErrorCode, BatchRecord | None]:
        """Classify a batch: (NONE, None) = append it; (NONE, record) = duplicate of
        ``record``; otherwise the error to answer with."""
        return classify(self._producers.get(producer_id), epoch, first_seq, last_seq)

    def admit(
        self, producer_id: int, epoch: int, first_seq: int, last_seq: int
    ) -> tuple[ErrorCode, BatchRecord | None, ProducerEntry | None]:
        """``check`` that also hands back the producer's entry, for ``track``: the
        append path's one lookup per batch."""
        entry = self._producers.get(producer_id)
        err, dup = classify(entry, epoch, first_seq, last_seq)
        return err, dup, entry

    def track(
        self,
        producer_id: int,
        entry: ProducerEntry | None,
        epoch: int,
        batch: BatchRecord,
        now_ms: int,
    ) -> None:
        """Record an appended batch under the entry ``admit`` returned (no lookup)."""
        if entry is None or epoch != entry.epoch:
            entry = ProducerEntry(epoch)
            self._producers[producer_id] = entry
        batches = entry.batches
        batches.append(batch)
        if len(batches) > MAX_TRACKED:
            del batches[0]
        entry.last_ms = now_ms

    def record(
        self,
        producer_id: int,
        epoch: int,
        first_seq: int,
        last_seq: int,
        base_offset: int,
        done: asyncio.Future[None] | None,
        last_ms: int,
    ) -> None:
        """Record a batch read back from a segment (``last_ms``: when it was written)."""
        entry = self._producers.get(producer_id)
        if entry is None or epoch != entry.epoch:
            entry = ProducerEntry(epoch)
            self._producers[producer_id] = entry
        batches = entry.batches
        batches.append(BatchRecord(first_seq, last_seq, base_offset, done))
        if len(batches) > MAX_TRACKED:
            del batches[0]
        entry.last_ms = max(entry.last_ms, last_ms)

    def idle(self, before_ms: int) -> bool:
        """Whether any producer last wrote before ``before_ms`` (a cheap test before
        ``expire``)."""
        return any(e.last_ms < before_ms for e in self._producers.values())

    def expire(self, before_ms: int, keep: Container[int] = ()) -> list[int]:
        """Forget the producers whose last write was before ``before_ms``, as Kafka
        forgets them after ``producer.id.expiration.ms``, except those in ``keep`` (an
        open transaction on this partition) and those with a batch not committed yet;
        returns their ids. A forgotten producer is accepted at any sequence again. The
        others let go of the futures of their committed batches."""
        gone = []
        for pid, e in self._producers.items():
            if e.last_ms < before_ms and pid not in keep and not e.in_flight():
                gone.append(pid)
                continue
            for b in e.batches:  # committed: its future is no longer needed (memory)
                done = b.done
                if done is not None and done.done() and not done.cancelled():
                    if done.exception() is None:
                        b.done = None
        for pid in gone:
            del self._producers[pid]
        return gone

    def last_bases(self) -> dict[int, int]:
        """producer id -> base offset of its last batch (compaction keeps that batch's
        header, docs/format.md "Compacted segments"); a rollback floor names no batch."""
        return {
            pid: e.batches[-1].base_offset
            for pid, e in self._producers.items()
            if e.batches and e.batches[-1].base_offset >= 0
        }

    def rollback(self, from_offset: int, firsts: Mapping[int, tuple[int, int, int]]) -> None:
        """Forget batches at or after ``from_offset`` (their append failed), keeping each
        producer's place: the next batch it may append is its earliest failed one.

        ``firsts`` maps a producer id to (epoch, first sequence, base offset) of its
        earliest failed batch, which may have left the last-five window. A producer whose
        tracked batches all failed keeps a floor (a record no batch matches, ending one
        before that sequence) instead of being forgotten: forgotten, it would be accepted
        at any sequence, and a later batch of its window, reaching this broker before the
        failed ones' retries, would be appended; the client would take that as proof that
        the failed batches were stored (librdkafka acknowledges them without an offset)
        and they would be lost."""
        for pid, entry in self._producers.items():
            failed = [b for b in entry.batches if b.base_offset >= from_offset]
            first = firsts.get(pid)
            if not failed and first is None:
                continue
            kept = [b for b in entry.batches if b.base_offset < from_offset]
            if not kept:
                earliest = min(failed, key=lambda b: b.base_offset, default=None)
                seq = earliest.first_seq if earliest is not None else -1
                if first is not None and first[0] == entry.epoch:
                    if earliest is None or first[2] < earliest.base_offset:
                        seq = first[1]
                if seq >= 0:
                    kept.append(BatchRecord(-1, seq - 1, -1, None))
            entry.batches = kept[-MAX_TRACKED:]

    def snapshot(self, upto: int, limit: int, full: int | None = None) -> list[SnapshotProducer]:
        """Each producer's tracked batches below ``upto`` (committed; a rollback floor
        counts; a producer with none there gets a floor before its first batch), for a
        persisted snapshot (``broker.producer_snapshot``): at most ``limit`` producers,
        those with a floor first, then the most recently written; past the first
        ``full`` of them (None: all) only each producer's last batch, which keeps its
        place (the next sequence) and a retry of that batch recognised."""
        out: list[SnapshotProducer] = []
        for pid, entry in self._producers.items():
            batches = tuple(
                (b.first_seq, b.last_seq, b.base_offset)
                for b in entry.batches
                if b.base_offset < upto
            )
            if not batches and entry.batches:  # only batches not committed yet: the
                # producer's place is before the first of them (a floor), whether they
                # commit (then they are replayed over it) or fail
                batches = ((-1, entry.batches[0].first_seq - 1, -1),)
            if batches:
                out.append((pid, entry.epoch, batches, entry.last_ms))
        if len(out) > (limit if full is None else min(limit, full)):
            out.sort(key=lambda e: (e[2][-1][2] < 0, e[3], e[2][-1][2]), reverse=True)
            del out[limit:]
            if full is not None:
                out[full:] = [(p, e, b[-1:], t) for p, e, b, t in out[full:]]
        return out

    def restore(self, producers: Iterable[SnapshotProducer], now_ms: int) -> None:
        """Track each snapshot producer's batches as its last ones; a producer without
        a last write time (an older snapshot) counts as written ``now_ms``."""
        for pid, epoch, batches, last_ms in producers:
            entry = ProducerEntry(epoch, last_ms=last_ms if last_ms >= 0 else now_ms)
            entry.batches = [BatchRecord(f, last, base, None) for f, last, base in batches]
            del entry.batches[:-MAX_TRACKED]
            self._producers[pid] = entry

    def __len__(self) -> int:
        return len(self._producers)

    def describe(self) -> list[tuple[int, int, int]]:
        """(producer id, epoch, last sequence) of every producer tracked, for
        DescribeProducers."""
        return [
            (pid, e.epoch, e.batches[-1].last_seq if e.batches else -1)
            for pid, e in self._producers.items()
        ]

    def last_write(self, producer_id: int) -> int:
        """When ``producer_id`` last wrote (ms since the epoch), -1 if it is unknown."""
        entry = self._producers.get(producer_id)
        return entry.last_ms if entry is not None else -1
