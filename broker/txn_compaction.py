"""What log compaction must respect of transactions (docs/architecture.md,
"Transactions"; the compactor calls these):

- ``cleanable_below_lso``: a pass never touches a segment that reaches the last stable
  offset (an open transaction may still abort: its records must not supersede others);
- ``aborted_batch``: the key map skips the batches of aborted transactions (an aborted
  write must never supersede a committed one), and the rewrite keeps them whole, like the
  markers, so the aborted-transaction index stays true for every reader.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.meta.schema import SegmentMeta
from broker.txn_partition import PartitionTxns
from protocol.batch import BatchHeader


def cleanable_below_lso(segments: Sequence[SegmentMeta], end: int, lso: int) -> int:
    """The cleanable segment count ``end`` cut to the segments wholly below ``lso``."""
    n = 0
    while n < min(end, len(segments)) and segments[n].last < lso:
        n += 1
    return n


def aborted_batch(st: PartitionTxns | None, hdr: BatchHeader) -> bool:
    """Whether ``hdr`` is a data batch of an aborted transaction."""
    if st is None or not hdr.is_transactional or hdr.is_control:
        return False
    pid, base = hdr.producer_id, hdr.base_offset
    return any(p == pid and first <= base <= last for last, p, first in st.aborted)
