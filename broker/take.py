"""The take's transaction: ownership of a partition at the next epoch, in one transaction
with the previous owner's acknowledged segments that only its cycle keys name
(``broker/cycles.py``, docs/architecture.md "Cycle keys")."""

from __future__ import annotations

import logging
import time
import uuid
from collections import OrderedDict
from typing import NamedTuple

from broker.cycles import chain_of
from broker.meta.base import Compare, Get, KeyValue, MetaStore, Put, TxnResult
from broker.meta.schema import (
    EndValue,
    SegmentMeta,
    broker_key,
    cycles_prefix,
    end_key,
    entry_base,
    epoch_key,
    epochs_prefix,
    owner_key,
    owner_value,
    producers_key,
    seg_entry_key,
    segments_prefix,
)
from broker.partition import PartitionLog

log = logging.getLogger(__name__)

# the take's own operations besides the chain's entries: three puts and three gets
TAKE_OPS = 6

#: what a take that succeeded returns: its transaction's result, the log end, the chain
Taken = tuple[TxnResult, int, list[SegmentMeta]]


class ChainCache:
    """The cycle keys of owners whose registration is gone, read once.

    Nothing can be committed under a registration that is gone (the cycle's compare
    fails), so a read that proves it gone in the same transaction holds every cycle the
    owner ever committed, and serves the takes of all its partitions: a broker's death
    hands the others all of its partitions at once. Keys deleted since (settled) are only
    entries no chain needs. An owner still registered (a hand-off) is read every time."""

    def __init__(self, size: int = 8, ttl_s: float = 60.0) -> None:
        self.size, self.ttl_s = size, ttl_s
        self._values: OrderedDict[tuple[int, int], tuple[float, list[bytes]]] = OrderedDict()
        self.reads = 0

    async def values(self, meta: MetaStore, broker: int, reg: int) -> list[bytes]:
        now = time.monotonic()
        hit = self._values.get((broker, reg))
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        prefix = cycles_prefix(broker, reg)
        self.reads += 1
        res = await meta.txn(
            [Compare(broker_key(broker), "create_revision", "!=", reg)],
            [Get(prefix, True)],
            [Get(prefix, True)],
        )
        values = [kv.value for kv in res.gets[0]]
        if res.succeeded:  # the registration is gone: complete for good
            self._values[(broker, reg)] = (now, values)
            self._values.move_to_end((broker, reg))
            while len(self._values) > self.size:
                self._values.popitem(last=False)
        return values


class Taker(NamedTuple):
    """Who takes: its node id, its lease, and its registration revision when it commits
    through cycle keys (0: it does not, and its end values name no owner)."""

    node_id: int
    lease_id: int
    reg: int


async def take_txn(
    meta: MetaStore,
    chains: ChainCache,
    me: Taker,
    tp: tuple[str, int, uuid.UUID],
    owner: KeyValue | None,
    end: KeyValue | None,
    prev: EndValue,
) -> Taken | None:
    """Take partition ``tp`` (topic, partition, topic id) from the state read as
    ``owner`` and ``end`` (``prev`` decoded): our owner key, the next epoch, and the
    previous owner's chain folded in. Returns the transaction's result (its gets: the
    manifest entries, the epochs, the producer snapshot), the log end and the chain; None
    when the partition moved since it was read, or when a chain too long for one
    transaction had its head folded first under the old epoch (the caller reads the
    partition again and takes it from there)."""
    topic, partition, topic_id = tp
    okey, ekey = owner_key(topic, partition), end_key(topic, partition)
    chain: list[SegmentMeta] = []
    if prev.broker >= 0:
        values = await chains.values(meta, prev.broker, prev.reg)
        chain = chain_of(values, prev, topic, partition, topic_id.hex)
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


def taken_log(
    node_id: int, tp: tuple[str, int, uuid.UUID], prev: EndValue, taken: Taken
) -> PartitionLog:
    """The log a successful ``take_txn`` serves, at the next epoch: the manifest entries
    its transaction read with the chain folded in, and the leader epochs it read."""
    res, next_offset, chain = taken
    topic, partition, topic_id = tp
    epoch = prev.epoch + 1
    by_base = {s.base: s for s in chain}
    for kv in res.gets[0]:
        by_base[entry_base(kv.key)] = SegmentMeta.from_json(entry_base(kv.key), kv.value)
    return PartitionLog(
        topic,
        partition,
        topic_id,
        epoch,
        owner_value(node_id, epoch, topic_id),
        res.revision,
        next_offset,
        [by_base[b] for b in sorted(by_base)],
        [(entry_base(kv.key), int(kv.value)) for kv in res.gets[1]],
        prev.log_start,
    )
