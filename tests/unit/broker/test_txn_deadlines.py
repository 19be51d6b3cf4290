"""broker/txn_deadlines.py: what is due for a transactional id, and the heap that orders
the deadlines (one per id, replaced entries skipped, memory bounded)."""

from __future__ import annotations

from broker.txn_deadlines import Deadlines, Due, due_for
from txncoord import TxnRecord, TxnState


def rec(state: TxnState, started: int = -1, updated: int = -1) -> TxnRecord:
    return TxnRecord(7, 0, 1000, state=state, started_ms=started, updated_ms=updated)


def test_due_for_each_state() -> None:
    assert due_for(rec(TxnState.ONGOING, started=50, updated=60), 10_000) == (1051, Due.TIMEOUT)
    for idle in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):
        assert due_for(rec(idle, updated=60), 10_000) == (10_061, Due.EXPIRE)
        assert due_for(rec(idle, updated=60), 0) is None  # expiry off
    assert due_for(rec(TxnState.PREPARE_COMMIT, started=50, updated=60), 10_000) is None


def test_one_deadline_per_id_earliest_first() -> None:
    d = Deadlines()
    assert d.set("a", (100, Due.TIMEOUT))  # the first is the earliest
    assert d.set("b", (50, Due.EXPIRE))
    assert not d.set("c", (70, Due.TIMEOUT))
    assert not d.set("b", (200, Due.EXPIRE))  # replaced: its old entry is skipped
    assert d.next_ms() == 70 and len(d) == 3
    assert d.pop_due(99) == [("c", Due.TIMEOUT)]
    assert d.pop_due(99) == []
    d.set("a", None)
    assert d.pop_due(10_000) == [("b", Due.EXPIRE)]
    assert d.next_ms() is None and len(d) == 0


def test_replaced_entries_do_not_pile_up() -> None:
    d = Deadlines()
    for i in range(10_000):
        d.set("busy", (i, Due.TIMEOUT))  # one id, changing state over and over
    assert len(d) == 1
    assert len(d._heap) <= 2 * len(d) + 65  # noqa: SLF001
    assert d.pop_due(10**9) == [("busy", Due.TIMEOUT)]
