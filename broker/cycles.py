"""Reading cycle keys: the chain a take folds, and when an entry is settled.

A broker with ``--cycle-keys-min-partitions`` commits a flush cycle of many partitions
as ONE key, ``/cycles/{broker}/{reg}/{seq}`` (``broker/fold.py``), and folds the entries
into each partition's own keys later, off the acknowledgement path. Until then an
acknowledged segment is named only there. This module holds the two rules every reader
of those keys follows (docs/architecture.md, "Cycle keys"):

* **The chain.** The end key of a partition names the owner of its epoch (node id and
  registration revision) when that owner commits through cycle keys. The entries of the
  partition that are acknowledged and not folded are the entries of that owner's cycle
  keys for the partition's topic id and the end's epoch, not aborted, that continue the
  log contiguously from the end's offset. A take folds the whole chain, in the same
  transaction as its epoch bump (or in transactions before it, under the old epoch), so
  an epoch that has been bumped has nothing left to fold.
* **Settled.** An entry no reader will ever need once its partition's end has moved past
  its base offset (folded, or an aborted cycle's offsets reused) or to a newer epoch, or
  its topic is gone or re-created. A cycle key whose entries are all settled can go.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from broker.meta.base import KeyValue
from broker.meta.schema import (
    CycleEntry,
    EndValue,
    SegmentMeta,
    TopicInfo,
    parse_cycle,
)

log = logging.getLogger(__name__)


class ChainError(Exception):
    """The chain cannot be read: two entries claim the same offsets under one owner and
    epoch, or a cycle key does not decode (never written by this broker: the take
    refuses rather than guess what was acknowledged)."""


def chain_of(
    values: Iterable[bytes], end: EndValue, topic: str, partition: int, topic_id: str
) -> list[SegmentMeta]:
    """The acknowledged, unfolded segments of one partition in ``values`` (the cycle
    keys of the owner ``end`` names), contiguous from ``end.next_offset``."""
    by_base: dict[int, list[SegmentMeta]] = {}
    for value in values:
        try:
            aborted, entries = parse_cycle(value)
        except (ValueError, KeyError, TypeError) as exc:
            raise ChainError(f"{topic}-{partition}: a cycle key does not decode: {exc!r}") from exc
        if aborted:
            continue
        for e in entries:
            if (
                e.topic == topic
                and e.partition == partition
                and e.topic_id == topic_id
                and e.epoch == end.epoch
                and e.segment.base >= end.next_offset
            ):
                by_base.setdefault(e.segment.base, []).append(e.segment)
    chain: list[SegmentMeta] = []
    cur = end.next_offset
    while cur in by_base:
        found = by_base.pop(cur)
        if len(found) > 1:
            raise ChainError(f"{topic}-{partition}: {len(found)} cycle entries at offset {cur}")
        chain.append(found[0])
        cur = found[0].last + 1
    if by_base:  # never written by an owner: its cycles are contiguous
        log.warning(
            "%s-%d: cycle entries past a gap ignored: %s", topic, partition, sorted(by_base)
        )
    return chain


def entry_settled(e: CycleEntry, topic: KeyValue | None, end: KeyValue | None) -> bool:
    """Whether no reader will ever need ``e`` (see the module doc), from its partition's
    topic key and end key read at one revision."""
    if topic is None:
        return True
    if TopicInfo.from_json(e.topic, topic.value).topic_id.hex != e.topic_id:
        return True
    if end is None:
        return False  # its keys half deleted, or not written yet: look again later
    value = EndValue.decode(end.value)
    return value.epoch > e.epoch or value.next_offset > e.segment.base


def entries_of(kvs: Sequence[KeyValue]) -> list[CycleEntry]:
    """Every entry (aborted or not) of the cycle keys ``kvs``; ChainError for one that
    does not decode."""
    try:
        return [e for kv in kvs for e in parse_cycle(kv.value)[1]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ChainError(f"a cycle key does not decode: {exc!r}") from exc
