"""The transaction state machine, as Kafka's TransactionCoordinator runs it for clients
that use transactions version 1 (EndTxn below v5): pure functions from the stored record
and a request to a ``Decision`` (docs/architecture.md, "Transactions").

    Empty/CompleteCommit/CompleteAbort --AddPartitions/AddOffsets--> Ongoing
    Ongoing --EndTxn(commit)--> PrepareCommit --markers written--> CompleteCommit
    Ongoing --EndTxn(abort), timeout, newer instance--> PrepareAbort --markers--> CompleteAbort

A timeout, or InitProducerId from a new instance while a transaction is ongoing, aborts
it with the producer epoch bumped: the markers carry the new epoch, which fences the old
instance on every partition it wrote to.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.errors import ErrorCode
from txncoord.model import TxnRecord, TxnState

MAX_EPOCH = 32767


@dataclass(frozen=True, slots=True)
class Decision:
    error: ErrorCode = ErrorCode.NONE
    record: TxnRecord | None = None  # the record to store (None: nothing changes)
    new_producer_id: bool = False  # the caller allocates a producer id for ``record``

    @property
    def prepares(self) -> bool:
        """The stored record will be PrepareCommit/PrepareAbort: markers are due."""
        return self.record is not None and self.record.state.preparing


def _fail(code: ErrorCode) -> Decision:
    return Decision(code)


def _bumped(rec: TxnRecord) -> tuple[TxnRecord, bool]:
    """``rec`` at the next producer epoch; past the limit a new producer id is needed."""
    if rec.producer_epoch + 1 >= MAX_EPOCH - 1:
        return rec.with_(producer_epoch=0, last_producer_epoch=-1), True
    return rec.with_(
        producer_epoch=rec.producer_epoch + 1, last_producer_epoch=rec.producer_epoch
    ), False


def _fencing(rec: TxnRecord) -> TxnRecord:
    """``rec`` at the next epoch, to abort its transaction with markers that fence the
    producer; at the epoch limit the same epoch (the markers must name this producer id;
    the next InitProducerId then moves to a new id)."""
    if rec.producer_epoch + 1 >= MAX_EPOCH - 1:
        return rec
    return rec.with_(producer_epoch=rec.producer_epoch + 1, last_producer_epoch=rec.producer_epoch)


def init_producer(
    rec: TxnRecord | None,
    timeout_ms: int,
    max_timeout_ms: int,
    producer_id: int,
    producer_epoch: int,
    now_ms: int,
) -> Decision:
    """InitProducerId with a transactional id (``producer_id``/``producer_epoch`` are -1
    unless a v3+ client recovers its current ones, KIP-360)."""
    if timeout_ms <= 0 or timeout_ms > max_timeout_ms:
        return _fail(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
    if rec is None:
        fresh = TxnRecord(-1, 0, timeout_ms, updated_ms=now_ms)
        return Decision(record=fresh, new_producer_id=True)
    if rec.state.preparing:
        return _fail(ErrorCode.CONCURRENT_TRANSACTIONS)
    if producer_id >= 0:
        known = producer_id == rec.producer_id and producer_epoch in (
            rec.producer_epoch,
            rec.last_producer_epoch,
        )
        if not known:
            return _fail(ErrorCode.PRODUCER_FENCED)
        if rec.state == TxnState.EMPTY and producer_epoch == rec.last_producer_epoch:
            return Decision(record=rec)  # a retry whose answer was lost: same epoch again
    if rec.state == TxnState.ONGOING:  # fence the old instance: abort at a new epoch
        aborting = _fencing(rec).with_(state=TxnState.PREPARE_ABORT, updated_ms=now_ms)
        return Decision(ErrorCode.CONCURRENT_TRANSACTIONS, aborting)
    bumped, new_pid = _bumped(rec)
    ready = bumped.with_(
        state=TxnState.EMPTY,
        timeout_ms=timeout_ms,
        partitions=frozenset(),
        groups=frozenset(),
        started_ms=-1,
        updated_ms=now_ms,
    )
    return Decision(record=ready, new_producer_id=new_pid)


def _check_producer(rec: TxnRecord | None, producer_id: int, epoch: int) -> ErrorCode:
    if rec is None or rec.producer_id != producer_id:
        return ErrorCode.INVALID_PRODUCER_ID_MAPPING
    if epoch != rec.producer_epoch:
        return ErrorCode.PRODUCER_FENCED
    return ErrorCode.NONE


def _join(
    rec: TxnRecord | None,
    producer_id: int,
    epoch: int,
    now_ms: int,
    partitions: frozenset[tuple[str, int]] = frozenset(),
    groups: frozenset[str] = frozenset(),
) -> Decision:
    err = _check_producer(rec, producer_id, epoch)
    if err != ErrorCode.NONE:
        return _fail(err)
    assert rec is not None
    if rec.state.preparing:
        return _fail(ErrorCode.CONCURRENT_TRANSACTIONS)
    if rec.state == TxnState.ONGOING and partitions <= rec.partitions and groups <= rec.groups:
        return Decision()
    started = rec.started_ms if rec.state == TxnState.ONGOING else now_ms
    if rec.state != TxnState.ONGOING:
        rec = rec.with_(partitions=frozenset(), groups=frozenset())
    return Decision(
        record=rec.with_(
            state=TxnState.ONGOING,
            partitions=rec.partitions | partitions,
            groups=rec.groups | groups,
            started_ms=started,
            updated_ms=now_ms,
        )
    )


def add_partitions(
    rec: TxnRecord | None,
    producer_id: int,
    epoch: int,
    partitions: frozenset[tuple[str, int]],
    now_ms: int,
) -> Decision:
    return _join(rec, producer_id, epoch, now_ms, partitions=partitions)


def add_groups(
    rec: TxnRecord | None, producer_id: int, epoch: int, group: str, now_ms: int
) -> Decision:
    return _join(rec, producer_id, epoch, now_ms, groups=frozenset({group}))


def end_txn(
    rec: TxnRecord | None, producer_id: int, epoch: int, commit: bool, now_ms: int
) -> Decision:
    err = _check_producer(rec, producer_id, epoch)
    if err != ErrorCode.NONE:
        return _fail(err)
    assert rec is not None
    state = rec.state
    if state == TxnState.ONGOING:
        target = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        return Decision(record=rec.with_(state=target, updated_ms=now_ms))
    done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
    preparing = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
    if state == done:
        return Decision()  # a retry of an EndTxn that completed
    if state == preparing:
        return _fail(ErrorCode.CONCURRENT_TRANSACTIONS)
    return _fail(ErrorCode.INVALID_TXN_STATE)


def timed_out(rec: TxnRecord, now_ms: int) -> Decision:
    """Abort (at a bumped epoch, fencing the producer) an ongoing transaction older than
    its timeout; nothing otherwise."""
    if rec.state != TxnState.ONGOING or rec.started_ms < 0:
        return Decision()
    if now_ms - rec.started_ms <= rec.timeout_ms:
        return Decision()
    return Decision(record=_fencing(rec).with_(state=TxnState.PREPARE_ABORT, updated_ms=now_ms))


def completed(rec: TxnRecord, now_ms: int) -> TxnRecord:
    """The record once every marker of a prepared transaction is written."""
    done = (
        TxnState.COMPLETE_COMMIT
        if rec.state == TxnState.PREPARE_COMMIT
        else TxnState.COMPLETE_ABORT
    )
    return rec.with_(
        state=done, partitions=frozenset(), groups=frozenset(), started_ms=-1, updated_ms=now_ms
    )
