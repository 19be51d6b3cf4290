"""The idempotent-producer state of a partition just taken over (docs/architecture.md,
"Idempotent producers").

With a persisted snapshot (``/logs/{t}/{p}/producers``, written by the owner's
maintenance and at a hand-off, ``broker.producer_snapshot``) the state is the
snapshot's producers plus the batch headers of every segment from its offset on:
complete, however long ago a producer last wrote (unless the log start has passed its
last batch, which evicts it, as Kafka does, or it expired: ``broker.maintenance``). A
producer replayed from a segment counts as last written when that segment was
committed (its manifest entry's ``created``). A snapshot that cannot be used (its offset
past the log end, or more than ``REPLAY_MAX_SEGMENTS`` / ``REPLAY_MAX_BYTES`` to replay)
is ignored with a warning, and the window below is read instead.

Without one, the state is rebuilt from the batch headers of the newest segments: the
newest ``MIN_SEGMENTS``, extended back while they hold less than ``WINDOW_BYTES`` (up
to ``MAX_SEGMENTS``). A busy partition's newest segments are small ones of single flush
cycles, and a producer that writes less often than the partition's other producers would
otherwise fall out of a four-segment window. A producer not in the window is unknown to
the new owner and accepted at any sequence (``broker.producers``).

A segment that cannot be read now fails the rebuild (the caller gives the partition
back): skipped, it could leave a producer unknown. A missing or malformed segment is
skipped with a warning, as reading it again would not help.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from broker.meta.schema import ProducerSnapshot, SegmentMeta
from broker.partition import PartitionLog, last_sequence
from segments.format import iter_segment_batches
from segments.store import Buffer, ObjectNotFoundError

log = logging.getLogger(__name__)

MIN_SEGMENTS = 4
WINDOW_BYTES = 16 << 20
MAX_SEGMENTS = 64
REPLAY_MAX_SEGMENTS = 128
REPLAY_MAX_BYTES = 64 << 20


def window(segments: Sequence[SegmentMeta]) -> list[SegmentMeta]:
    """The newest segments the rebuild reads, oldest first."""
    picked: list[SegmentMeta] = []
    size = 0
    for seg in reversed(segments):
        if len(picked) >= MAX_SEGMENTS:
            break
        if len(picked) >= MIN_SEGMENTS and size >= WINDOW_BYTES:
            break
        picked.append(seg)
        size += seg.size
    picked.reverse()
    return picked


def segments_from(lg: PartitionLog, offset: int) -> list[SegmentMeta]:
    """The segments holding offsets at or after ``offset``, oldest first."""
    first = max(bisect.bisect_right(lg.bases, offset) - 1, 0)
    return [s for s in lg.segments[first:] if s.last >= offset]


def _decode(lg: PartitionLog, stored: bytes | None) -> ProducerSnapshot | None:
    if stored is None:
        return None
    try:
        return ProducerSnapshot.decode(stored)
    except ValueError as exc:
        log.warning("producer snapshot of %s-%d ignored: %s", lg.topic, lg.partition, exc)
        return None


def replay_range(lg: PartitionLog, snap: ProducerSnapshot) -> list[SegmentMeta] | None:
    """The segments to replay on top of ``snap``, oldest first; None when it cannot be
    used (why: logged)."""
    where = f"{lg.topic}-{lg.partition}"
    if snap.upto > lg.next_offset:
        log.warning("producer snapshot of %s at %d is past the log end: ignored", where, snap.upto)
        return None
    segs = segments_from(lg, snap.upto)
    if len(segs) > REPLAY_MAX_SEGMENTS or sum(s.size for s in segs) > REPLAY_MAX_BYTES:
        log.warning(
            "producer snapshot of %s at %d is %d segments behind: reading the newest only",
            where,
            snap.upto,
            len(segs),
        )
        return None
    return segs


async def rebuild(
    lg: PartitionLog,
    load: Callable[[SegmentMeta], Awaitable[Buffer]],
    ahead: Callable[[Sequence[SegmentMeta]], object],
    stored: bytes | None = None,
) -> None:
    """Record every idempotent batch of the window in ``lg.producers``, in offset order,
    on top of the ``stored`` snapshot when it can be used (the window is then every
    segment from its offset on). ``load`` reads one segment (joining a load in flight);
    before each, ``ahead`` is given the rest of the window, for the read path's readahead
    (``LogManager``: the segment loader's, bounded per broker), so many small segments
    cost few round trips. Sets ``lg.snapshot_upto`` (-1: no snapshot; -2: one that must
    be rewritten). Raises the store's error when a segment cannot be read now."""
    now_ms = int(time.time() * 1000)  # a restored producer without a time; a segment
    # without its commit time
    snap = _decode(lg, stored)
    segs = replay_range(lg, snap) if snap is not None else None
    start = 0
    if snap is None:
        lg.snapshot_upto = -1 if stored is None else -2
    elif segs is None:
        lg.snapshot_upto = -2
    else:
        start = lg.snapshot_upto = snap.upto
        floors = snap.upto >= lg.log_start  # a floor's producer may be past the start
        lg.producers.restore(
            (
                p
                for p in snap.producers
                if p[2][-1][2] >= lg.log_start or (p[2][-1][2] < 0 and floors)
            ),
            now_ms,
        )
    if segs is None:
        segs = window(lg.segments)
    for i, seg in enumerate(segs):
        ahead(segs[i + 1 :])
        try:
            data = await load(seg)
        except (ObjectNotFoundError, ValueError) as exc:
            log.warning("producer state rebuild skipped a segment: %s", exc)
            continue
        for _pos, hdr, _view in iter_segment_batches(data):
            if hdr.producer_id >= 0 and hdr.base_sequence >= 0 and hdr.base_offset >= start:
                lg.producers.record(
                    hdr.producer_id,
                    hdr.producer_epoch,
                    hdr.base_sequence,
                    last_sequence(hdr.base_sequence, hdr.last_offset_delta),
                    hdr.base_offset,
                    None,
                    seg.created_ms if seg.created_ms >= 0 else now_ms,
                )
