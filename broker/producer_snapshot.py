"""Persisted producer snapshots: the owner's maintenance writes the idempotent-producer
state of a partition to ``/logs/{t}/{p}/producers`` (docs/format.md, "Producer
snapshots"), so that a new owner knows every producer, not only those of the newest
segments (``broker.producer_rebuild``; docs/architecture.md, "Idempotent producers").

A snapshot holds, per producer, its tracked batches (up to five, as the owner keeps them)
below the snapshot's offset (the high watermark when it was taken: committed batches
only), so a retry of any of them is still recognised as a duplicate after a move. It is
written when none is stored yet and the partition has producers, when the stored one
could not be used at takeover, and when the segments after it reach ``SNAPSHOT_BYTES``
or ``SNAPSHOT_SEGMENTS``, so a takeover replays about that much; a hand-off puts it with
the owner key's release (``put_op``), so the next owner replays nothing. The put is
guarded by the owner value alone: a zombie's put fails, and any snapshot that lands is
true of the log, so an outcome the metadata store could not confirm needs no resolution
(the next pass writes again).
"""

from __future__ import annotations

import logging

from broker.commit import Committer
from broker.meta.base import MetaStore, Put
from broker.meta.schema import ProducerSnapshot, producers_key
from broker.partition import PartitionLog
from broker.producer_rebuild import segments_from

log = logging.getLogger(__name__)

SNAPSHOT_BYTES = 8 << 20
SNAPSHOT_SEGMENTS = 32
# producers per snapshot, the most recently written kept: the first SNAPSHOT_FULL with
# every batch tracked (up to 5), the rest with their last batch only (at most ~0.7 MB)
SNAPSHOT_LIMIT = 16_384
SNAPSHOT_FULL = 2048


def due(lg: PartitionLog) -> bool:
    """Whether ``lg`` needs a new snapshot."""
    upto = lg.snapshot_upto
    if upto == -2:
        return True
    if upto == -1:
        return len(lg.producers) > 0 and lg.hw > 0
    if lg.hw <= upto:
        return False
    since = segments_from(lg, upto)
    return len(since) >= SNAPSHOT_SEGMENTS or sum(s.size for s in since) >= SNAPSHOT_BYTES


def put_op(lg: PartitionLog) -> Put | None:
    """The put of ``lg``'s snapshot at its high watermark (None when it has nothing to
    keep: no producer and no snapshot stored), for a transaction guarded by its owner
    value: this module's ``write``, and the owner key's release at a hand-off
    (``LogManager``), so that the next owner replays nothing."""
    if lg.snapshot_upto == -1 and not len(lg.producers):
        return None
    producers = lg.producers.snapshot(lg.hw, SNAPSHOT_LIMIT, SNAPSHOT_FULL)
    snap = ProducerSnapshot(lg.hw, tuple(producers))
    return Put(producers_key(lg.topic, lg.partition), snap.encode())


async def write(meta: MetaStore, lg: PartitionLog) -> bool:
    """Write ``lg``'s snapshot at its high watermark; False when the owner guard failed
    (another owner has the partition). A store error propagates."""
    upto, op = lg.hw, put_op(lg)
    if op is None:
        return True
    res = await meta.txn([Committer.owner_guard(lg)], [op])
    if res.succeeded:
        lg.snapshot_upto = upto
        log.debug("producer snapshot of %s-%d at %d", lg.topic, lg.partition, upto)
    return res.succeeded
