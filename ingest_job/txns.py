"""Transactions in the ingest job (docs/ingest.md; docs/architecture.md, "Transactions"):
only committed records reach a table.

A partition is read up to its last stable offset (the first offset of its oldest open
transaction, ``/logs/{t}/{p}/txn/open/``), so an open transaction holds the job there,
and the batches of aborted transactions (``/logs/{t}/{p}/txn/aborted/``: producer id,
first offset, abort marker offset) are skipped. Control batches never reach a table.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.meta.base import MetaStore
from broker.meta.schema import AbortedTxn, OpenTxn, partition_txn_prefix
from protocol.batch import BatchHeader

Aborted = tuple[int, int, int]  # (producer id, first offset, abort marker offset)


async def read_txns(
    meta: MetaStore, topic: str, partition: int
) -> tuple[int | None, tuple[Aborted, ...]]:
    """(last stable offset bound or None when no transaction is open, aborted ranges)."""
    prefix = partition_txn_prefix(topic, partition)
    lso: int | None = None
    aborted: list[Aborted] = []
    for kv in await meta.range(prefix):
        kind = kv.key[len(prefix) :].split("/", 1)[0]
        if kind == "open":
            first = OpenTxn.from_json(kv.value).first
            lso = first if lso is None else min(lso, first)
        elif kind == "aborted":
            a = AbortedTxn.from_json(kv.value)
            aborted.append((a.producer_id, a.first, a.last))
    return lso, tuple(sorted(aborted, key=lambda a: a[2]))


def overlapping(aborted: Sequence[Aborted], start: int, end: int) -> tuple[Aborted, ...]:
    """The aborted ranges that overlap offsets ``[start, end)``."""
    return tuple(a for a in aborted if a[2] >= start and a[1] < end)


def is_aborted(hdr: BatchHeader, aborted: Sequence[Aborted]) -> bool:
    """Whether ``hdr`` is a batch of an aborted transaction."""
    if not hdr.is_transactional or hdr.is_control:
        return False
    return any(
        pid == hdr.producer_id and first <= hdr.base_offset <= last for pid, first, last in aborted
    )
