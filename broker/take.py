"""The take's transaction: ownership of a partition at the next epoch, in one transaction
with the previous owner's acknowledged segments that only its cycle keys name
(``broker/cycles.py``, docs/architecture.md "Cycle keys")."""

from __future__ import annotations

import logging
import uuid
from typing import NamedTuple

from broker.cycles import read_chain
from broker.meta.base import Compare, Get, KeyValue, MetaStore, Put, TxnResult
from broker.meta.schema import (
    EndValue,
    SegmentMeta,
    end_key,
    epoch_key,
    epochs_prefix,
    owner_key,
    owner_value,
    producers_key,
    seg_entry_key,
    segments_prefix,
)

log = logging.getLogger(__name__)

# the take's own operations besides the chain's entries: three puts and three gets
TAKE_OPS = 6


class Taker(NamedTuple):
    """Who takes: its node id, its lease, and its registration revision when it commits
    through cycle keys (0: it does not, and its end values name no owner)."""

    node_id: int
    lease_id: int
    reg: int


async def take_txn(
    meta: MetaStore,
    me: Taker,
    tp: tuple[str, int, uuid.UUID],
    owner: KeyValue | None,
    end: KeyValue | None,
    prev: EndValue,
) -> tuple[TxnResult, int, list[SegmentMeta]] | None:
    """Take partition ``tp`` (topic, partition, topic id) from the state read as
    ``owner`` and ``end`` (``prev`` decoded): our owner key, the next epoch, and the
    previous owner's chain folded in. Returns the transaction's result (its gets: the
    manifest entries, the epochs, the producer snapshot), the log end and the chain; None
    when the partition moved since it was read, or when a chain too long for one
    transaction had its head folded first under the old epoch (the caller reads the
    partition again and takes it from there)."""
    topic, partition, topic_id = tp
    okey, ekey = owner_key(topic, partition), end_key(topic, partition)
    chain = await read_chain(meta, prev, topic, partition, topic_id.hex)
    guard = [
        Compare(okey, "value", "==", owner.value)
        if owner is not None
        else Compare(okey, "create_revision", "==", 0),
        Compare(ekey, "mod_revision", "==", end.mod_revision if end else 0),
    ]
    entries = [Put(seg_entry_key(topic, partition, s.base), s.to_json()) for s in chain]
    room = meta.max_txn_ops - TAKE_OPS
    if len(chain) > room:
        head = chain[:room]
        moved = EndValue(head[-1].last + 1, prev.epoch, prev.log_start, prev.broker, prev.reg)
        await meta.txn(guard, [*entries[:room], Put(ekey, moved.encode())])
        return None
    next_offset = chain[-1].last + 1 if chain else prev.next_offset
    epoch = prev.epoch + 1
    named = (me.node_id, me.reg) if me.reg else (-1, 0)
    res = await meta.txn(
        guard,
        [
            Put(okey, owner_value(me.node_id, epoch, topic_id), me.lease_id),
            Put(ekey, EndValue(next_offset, epoch, prev.log_start, *named).encode()),
            Put(epoch_key(topic, partition, epoch), str(next_offset).encode()),
            *entries,
            Get(segments_prefix(topic, partition), True),
            Get(epochs_prefix(topic, partition), True),
            Get(producers_key(topic, partition)),
        ],
    )
    if not res.succeeded:
        return None
    if chain:
        log.info(
            "%s-%d: %d acknowledged segments folded from cycle keys at the take",
            topic,
            partition,
            len(chain),
        )
    return res, next_offset, chain
