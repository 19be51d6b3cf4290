"""The idempotent-producer state of a partition just taken over, rebuilt from the batch
headers of its newest segments (docs/architecture.md, "Idempotent producers").

The window is the newest ``MIN_SEGMENTS`` segments, extended back while it holds less
than ``WINDOW_BYTES`` (up to ``MAX_SEGMENTS``): a busy partition's newest segments are
small ones of single flush cycles, and a producer that writes less often than the
partition's other producers would otherwise fall out of a four-segment window. A producer
not in the window is unknown to the new owner and accepted at any sequence
(``broker.producers``).

A segment that cannot be read now fails the rebuild (the caller gives the partition
back): skipped, it could leave a producer unknown. A missing or malformed segment is
skipped with a warning, as reading it again would not help.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from broker.meta.schema import SegmentMeta
from broker.partition import PartitionLog, last_sequence
from segments.format import iter_segment_batches
from segments.store import Buffer, ObjectNotFoundError

log = logging.getLogger(__name__)

MIN_SEGMENTS = 4
WINDOW_BYTES = 16 << 20
MAX_SEGMENTS = 64


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


async def rebuild(
    lg: PartitionLog,
    load: Callable[[SegmentMeta], Awaitable[Buffer]],
    ahead: Callable[[Sequence[SegmentMeta]], object],
) -> None:
    """Record every idempotent batch of the window in ``lg.producers``, in offset order.
    ``load`` reads one segment (joining a load in flight); before each, ``ahead`` is
    given the rest of the window, for the read path's readahead (``LogManager``: the
    segment loader's, bounded per broker), so many small segments cost few round trips.
    Raises the store's error when a segment cannot be read now."""
    segs = window(lg.segments)
    for i, seg in enumerate(segs):
        ahead(segs[i + 1 :])
        try:
            data = await load(seg)
        except (ObjectNotFoundError, ValueError) as exc:
            log.warning("producer state rebuild skipped a segment: %s", exc)
            continue
        for _pos, hdr, _view in iter_segment_batches(data):
            if hdr.producer_id >= 0 and hdr.base_sequence >= 0:
                lg.producers.record(
                    hdr.producer_id,
                    hdr.producer_epoch,
                    hdr.base_sequence,
                    last_sequence(hdr.base_sequence, hdr.last_offset_delta),
                    hdr.base_offset,
                    None,
                )
