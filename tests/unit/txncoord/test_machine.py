"""The transaction state machine (txncoord.machine): Kafka's transitions and error codes."""

from __future__ import annotations

from protocol.errors import ErrorCode as E
from txncoord import TxnRecord, TxnState
from txncoord import machine as m

MAX = 60_000
P = frozenset({("t", 0), ("t", 1)})


def fresh() -> TxnRecord:
    dec = m.init_producer(None, 10_000, MAX, -1, -1, 1)
    assert dec.error == E.NONE and dec.new_producer_id and dec.record is not None
    return dec.record.with_(producer_id=7)


def ongoing() -> TxnRecord:
    rec = m.add_partitions(fresh(), 7, 0, P, 5).record
    assert rec is not None
    return rec


def test_init_validates_timeout() -> None:
    assert m.init_producer(None, 0, MAX, -1, -1, 1).error == E.INVALID_TRANSACTION_TIMEOUT
    assert m.init_producer(None, MAX + 1, MAX, -1, -1, 1).error == E.INVALID_TRANSACTION_TIMEOUT
    assert m.init_producer(fresh(), MAX + 1, MAX, -1, -1, 1).error == E.INVALID_TRANSACTION_TIMEOUT


def test_init_bumps_epoch_and_kip360_recovery() -> None:
    rec = fresh()
    dec = m.init_producer(rec, 10_000, MAX, -1, -1, 2)
    assert dec.record is not None and dec.record.producer_epoch == 1
    assert dec.record.last_producer_epoch == 0 and dec.record.producer_id == 7
    bumped = dec.record
    # KIP-360: the producer names its current id and epoch: bumped again
    again = m.init_producer(bumped, 10_000, MAX, 7, 1, 3).record
    assert again is not None and again.producer_epoch == 2
    # a retry with the previous epoch (its answer was lost) gets the same epoch back
    retry = m.init_producer(again, 10_000, MAX, 7, 1, 4).record
    assert retry is not None and retry.producer_epoch == 2
    # an unknown id or a stale epoch is fenced
    assert m.init_producer(again, 10_000, MAX, 8, 2, 5).error == E.PRODUCER_FENCED
    assert m.init_producer(again, 10_000, MAX, 7, 0, 5).error == E.PRODUCER_FENCED


def test_init_exhausted_epoch_gets_new_producer_id() -> None:
    rec = fresh().with_(producer_epoch=m.MAX_EPOCH - 2)
    dec = m.init_producer(rec, 10_000, MAX, -1, -1, 2)
    assert dec.new_producer_id and dec.record is not None and dec.record.producer_epoch == 0


def test_new_instance_aborts_ongoing_at_bumped_epoch() -> None:
    dec = m.init_producer(ongoing(), 10_000, MAX, -1, -1, 9)
    assert dec.error == E.CONCURRENT_TRANSACTIONS and dec.prepares
    assert dec.record is not None and dec.record.state == TxnState.PREPARE_ABORT
    assert dec.record.producer_epoch == 1 and dec.record.partitions == P
    assert m.init_producer(dec.record, 10_000, MAX, -1, -1, 9).error == E.CONCURRENT_TRANSACTIONS


def test_add_partitions_checks_producer_and_state() -> None:
    rec = fresh()
    assert m.add_partitions(None, 7, 0, P, 1).error == E.INVALID_PRODUCER_ID_MAPPING
    assert m.add_partitions(rec, 8, 0, P, 1).error == E.INVALID_PRODUCER_ID_MAPPING
    assert m.add_partitions(rec, 7, 1, P, 1).error == E.PRODUCER_FENCED
    on = ongoing()
    assert on.state == TxnState.ONGOING and on.started_ms == 5
    assert m.add_partitions(on, 7, 0, frozenset({("t", 0)}), 6).record is None  # no change
    more = m.add_partitions(on, 7, 0, frozenset({("u", 3)}), 6).record
    assert more is not None and more.partitions == P | {("u", 3)} and more.started_ms == 5
    group = m.add_groups(on, 7, 0, "g", 6).record
    assert group is not None and group.groups == {"g"}
    prep = m.end_txn(on, 7, 0, True, 7).record
    assert prep is not None
    assert m.add_partitions(prep, 7, 0, P, 8).error == E.CONCURRENT_TRANSACTIONS


def test_end_txn_states() -> None:
    on = ongoing()
    assert m.end_txn(fresh(), 7, 0, True, 1).error == E.INVALID_TXN_STATE  # Empty
    assert m.end_txn(on, 7, 1, True, 1).error == E.PRODUCER_FENCED
    commit = m.end_txn(on, 7, 0, True, 1)
    assert commit.prepares and commit.record is not None
    prep = commit.record
    assert prep.state == TxnState.PREPARE_COMMIT
    assert m.end_txn(prep, 7, 0, True, 2).error == E.CONCURRENT_TRANSACTIONS  # retry
    assert m.end_txn(prep, 7, 0, False, 2).error == E.INVALID_TXN_STATE
    done = m.completed(prep, 3)
    assert done.state == TxnState.COMPLETE_COMMIT and not done.partitions
    assert m.end_txn(done, 7, 0, True, 4) == m.Decision()  # a retry that completed
    assert m.end_txn(done, 7, 0, False, 4).error == E.INVALID_TXN_STATE
    # the next transaction starts afresh from Complete
    nxt = m.add_partitions(done, 7, 0, frozenset({("u", 1)}), 5).record
    assert nxt is not None and nxt.partitions == {("u", 1)} and nxt.started_ms == 5


def test_timeout_aborts_with_fencing_epoch() -> None:
    on = ongoing()  # started at 5, timeout 10 s
    assert m.timed_out(on, 5 + 10_000).record is None
    dec = m.timed_out(on, 5 + 10_001)
    assert dec.record is not None and dec.record.state == TxnState.PREPARE_ABORT
    assert dec.record.producer_epoch == 1
    assert m.add_partitions(dec.record, 7, 0, P, 1).error == E.PRODUCER_FENCED
    assert m.timed_out(fresh(), 10**12).record is None


def test_record_json_round_trip() -> None:
    rec = m.add_groups(ongoing(), 7, 0, "g/1", 6).record
    assert rec is not None
    assert TxnRecord.from_json(rec.to_json()) == rec


def test_fencing_at_the_epoch_limit_keeps_the_producer_id() -> None:
    worn = ongoing().with_(producer_epoch=m.MAX_EPOCH - 2)
    dec = m.init_producer(worn, 10_000, MAX, -1, -1, 9)
    assert dec.record is not None and dec.record.state == TxnState.PREPARE_ABORT
    # the abort markers must still name this producer at an epoch its batches carry
    assert (dec.record.producer_id, dec.record.producer_epoch) == (7, m.MAX_EPOCH - 2)
    done = m.completed(dec.record, 10)
    nxt = m.init_producer(done, 10_000, MAX, -1, -1, 11)
    assert nxt.new_producer_id and nxt.record is not None and nxt.record.producer_epoch == 0
