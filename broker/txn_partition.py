"""The transaction state of one owned partition (docs/architecture.md, "Transactions").

- **Open transactions**: per producer id, a lower bound of the transaction's first offset
  on this partition. The last stable offset (LSO) is the smallest of them, or the high
  watermark when none is open; ``read_committed`` fetches stop there.
- **Aborted transactions**: (producer id, first offset, abort marker offset), returned to
  ``read_committed`` fetches that overlap them, so clients drop those records.

Both live in the metadata store (``/logs/{t}/{p}/txn/open/``, ``.../txn/aborted/``),
written by the owner under its owner guard, so a new owner finds them; the owner keeps
them in memory (``PartitionLog.txns``), loaded once on first use after it takes the
partition. ``lock`` serialises the admission of a transaction's first batch with the
writing of markers, so no batch of a transaction lands after its marker.
"""

from __future__ import annotations

import asyncio
from bisect import insort
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker.meta.base import MetaStore
from broker.meta.schema import AbortedTxn, OpenTxn, partition_txn_prefix
from protocol.batch import CorruptBatchError, iter_batches

if TYPE_CHECKING:
    from broker.partition import PartitionLog


@dataclass(slots=True)
class PartitionTxns:
    open: dict[int, OpenTxn] = field(default_factory=dict)
    aborted: list[tuple[int, int, int]] = field(default_factory=list)  # (last, pid, first)
    fenced: dict[int, int] = field(default_factory=dict)  # pid -> epoch of its last marker
    closed: dict[int, AbortedTxn | None] = field(default_factory=dict)  # last marker per pid
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    loaded: bool = False

    def lso(self, hw: int) -> int:
        if not self.open:
            return hw
        return min(hw, min(t.first for t in self.open.values()))

    def add_aborted(self, entry: AbortedTxn) -> None:
        insort(self.aborted, (entry.last, entry.producer_id, entry.first))

    def aborted_between(self, start: int, end: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of aborted transactions overlapping [start, end)."""
        return sorted(
            (pid, first) for last, pid, first in self.aborted if last >= start and first < end
        )

    def forget_below(self, log_start: int) -> None:
        """Entries wholly below the log start are needed by nobody."""
        self.aborted = [a for a in self.aborted if a[0] >= log_start]


async def state_of(meta: MetaStore, lg: PartitionLog) -> PartitionTxns:
    """``lg``'s transaction state, loaded from the metadata store on first use."""
    st = lg.txns
    if st is None:
        st = lg.txns = PartitionTxns()
    if not st.loaded:
        async with st.lock:
            if not st.loaded:
                prefix = partition_txn_prefix(lg.topic, lg.partition)
                for kv in await meta.range(prefix):
                    kind = kv.key[len(prefix) :].split("/", 1)[0]
                    if kind == "open":
                        t = OpenTxn.from_json(kv.value)
                        st.open[t.producer_id] = t
                    elif kind == "aborted":
                        st.add_aborted(AbortedTxn.from_json(kv.value))
                st.loaded = True
    return st


def loaded_state(lg: PartitionLog) -> PartitionTxns | None:
    st = lg.txns
    return st if st is not None and st.loaded else None


def cap_batches(records: list[memoryview], upper: int) -> list[memoryview]:
    """The whole batches of ``records`` that start below ``upper``."""
    out: list[memoryview] = []
    for buf in records:
        size = 0
        try:
            for hdr, view in iter_batches(buf):
                if hdr.base_offset >= upper:
                    break
                size += len(view)
            else:
                out.append(buf)
                continue
        except CorruptBatchError:
            out.append(buf)  # not ours to judge here: the reader returned it
            continue
        if size:
            out.append(buf[:size])
        break
    return out
