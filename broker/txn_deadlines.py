"""When the transaction coordinator must look at a transactional id again
(docs/architecture.md, "Transactions"): an ongoing transaction at its timeout, an idle
id at its expiry (``transactional.id.expiration.ms``).

The coordinator keeps a watch-fed copy of every id's state (``TxnCoordinator._follow``)
and asks ``due_for`` what each state change means; the ``Deadlines`` heap then wakes it at
the earliest one, so no timer or scan runs for ids with nothing due. No I/O here.
"""

from __future__ import annotations

import enum
import heapq

from txncoord import TxnRecord, TxnState


class Due(enum.Enum):
    TIMEOUT = "timeout"  # abort the ongoing transaction (it ran past its timeout)
    EXPIRE = "expire"  # delete the id's state (idle past the expiration)
    COMPLETE = "complete"  # try again to complete a prepared transaction (a try failed)


IDLE = frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT})


def due_for(rec: TxnRecord, expiration_ms: int) -> tuple[int, Due] | None:
    """(wall-clock ms, what) of the next thing due for an id in state ``rec``, if any.
    Prepared transactions are not timed: they are completed as soon as they are seen."""
    if rec.state == TxnState.ONGOING and rec.started_ms >= 0:
        return rec.started_ms + rec.timeout_ms + 1, Due.TIMEOUT
    if rec.state in IDLE and rec.updated_ms >= 0 and expiration_ms > 0:
        return rec.updated_ms + expiration_ms + 1, Due.EXPIRE
    return None


class Deadlines:
    """One pending deadline per transactional id, the earliest first. Setting a new one
    replaces the id's old one; replaced entries stay in the heap until they surface (and
    are skipped) or the heap is rebuilt, which happens once stale entries outnumber live
    ones, so memory stays proportional to the ids with something due."""

    def __init__(self) -> None:
        self._live: dict[str, tuple[int, Due]] = {}
        self._heap: list[tuple[int, str, Due]] = []

    def __len__(self) -> int:
        return len(self._live)

    def set(self, txn_id: str, due: tuple[int, Due] | None) -> bool:
        """Replace ``txn_id``'s deadline (None: nothing due). True when the earliest
        deadline moved earlier (a waiter should recompute its timeout)."""
        if due is None:
            self._live.pop(txn_id, None)
            return False
        if self._live.get(txn_id) == due:
            return False
        earliest = self.next_ms()
        self._live[txn_id] = due
        heapq.heappush(self._heap, (due[0], txn_id, due[1]))
        if len(self._heap) > 2 * len(self._live) + 64:
            self._heap = [(at, tid, what) for tid, (at, what) in self._live.items()]
            heapq.heapify(self._heap)
        return earliest is None or due[0] < earliest

    def clear(self) -> None:
        self._live.clear()
        self._heap.clear()

    def next_ms(self) -> int | None:
        """The earliest live deadline (wall-clock ms), or None."""
        while self._heap:
            at, tid, what = self._heap[0]
            if self._live.get(tid) == (at, what):
                return at
            heapq.heappop(self._heap)
        return None

    def pop_due(self, now_ms: int) -> list[tuple[str, Due]]:
        """Remove and return every deadline at or before ``now_ms``."""
        out = []
        while (at := self.next_ms()) is not None and at <= now_ms:
            _, tid, what = heapq.heappop(self._heap)
            del self._live[tid]
            out.append((tid, what))
        return out
