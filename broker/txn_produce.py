"""Admission of transactional batches on the partition's owner (docs/architecture.md,
"Transactions").

A producer's first batch of a transaction on a partition is checked against the
coordinator's record (``/txn/{tid}/state``): same producer id and epoch, state Ongoing,
the partition added to the transaction. Then the open transaction is stored at
``/logs/{t}/{p}/txn/open/{pid}`` in one metadata transaction that compares the owner key
and the coordinator record's revision, so it is never stored for a transaction that has
ended meanwhile. Later batches of the same open transaction need no metadata round trip.
A batch whose epoch is older than the partition's last marker or the coordinator's epoch
is refused with INVALID_PRODUCER_EPOCH and the partition is unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from broker.meta.base import Compare, Get, MetaStore, MetaStoreError, Put
from broker.meta.schema import OpenTxn, open_txn_key, owner_key, txn_state_key
from broker.partition import PartitionLog
from broker.txn_partition import PartitionTxns, state_of
from protocol.batch import BatchHeader, any_transactional, iter_batches, read_header
from protocol.errors import ErrorCode
from txncoord import TxnRecord, TxnState

log = logging.getLogger(__name__)

T = TypeVar("T")
ATTEMPTS = 5


def transactional_header(records: memoryview | None) -> BatchHeader | None:
    """The header of the record set's first batch when any batch is transactional (the
    full validation comes later; a corrupt set is left to it)."""
    if records is None or not any_transactional(records):
        return None
    return read_header(records)


def _uniform(records: memoryview, first: BatchHeader) -> bool:
    return all(
        h.is_transactional
        and h.producer_id == first.producer_id
        and h.producer_epoch == first.producer_epoch
        for h, _ in iter_batches(records)
    )


async def append_transactional(
    meta: MetaStore,
    lg: PartitionLog,
    txn_id: str | None,
    records: memoryview,
    hdr: BatchHeader,
    do_append: Callable[[], T],
    fail: Callable[[ErrorCode], T],
) -> T:
    """Admit the transactional ``records`` and append them (``do_append``), or answer
    ``fail(error)`` without touching the partition."""
    if txn_id is None or not _uniform(records, hdr) or hdr.producer_id < 0:
        return fail(ErrorCode.INVALID_RECORD)
    try:
        st = await state_of(meta, lg)
        async with st.lock:
            err = await _admit(meta, lg, st, txn_id, hdr.producer_id, hdr.producer_epoch)
            if err != ErrorCode.NONE:
                return fail(err)
            return do_append()  # no await since the admission: the marker cannot slip in
    except MetaStoreError as exc:
        log.warning("transactional produce to %s-%d: %s", lg.topic, lg.partition, exc)
        return fail(ErrorCode.NOT_LEADER_OR_FOLLOWER)


async def _admit(
    meta: MetaStore, lg: PartitionLog, st: PartitionTxns, txn_id: str, pid: int, epoch: int
) -> ErrorCode:
    if epoch < st.fenced.get(pid, -1):
        return ErrorCode.INVALID_PRODUCER_EPOCH
    current = st.open.get(pid)
    if current is not None:
        if current.producer_epoch == epoch:
            return ErrorCode.NONE
        if epoch < current.producer_epoch:
            return ErrorCode.INVALID_PRODUCER_EPOCH
        return ErrorCode.INVALID_TXN_STATE  # its older transaction is not ended here yet
    okey, skey = owner_key(lg.topic, lg.partition), txn_state_key(txn_id)
    for _ in range(ATTEMPTS):
        kv = await meta.get(skey)
        rec = TxnRecord.from_json(kv.value) if kv is not None else None
        if rec is None or rec.producer_id != pid:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if epoch < rec.producer_epoch:
            return ErrorCode.INVALID_PRODUCER_EPOCH
        if (
            epoch != rec.producer_epoch
            or rec.state != TxnState.ONGOING
            or (lg.topic, lg.partition) not in rec.partitions
        ):
            return ErrorCode.INVALID_TXN_STATE
        assert kv is not None
        # the committed end: a lower bound of where its batch lands, even if a failed
        # flush rewinds the uncommitted tail meanwhile
        entry = OpenTxn(pid, epoch, lg.hw, txn_id)
        res = await meta.txn(
            [
                Compare(okey, "value", "==", lg.owner_value),
                Compare(skey, "mod_revision", "==", kv.mod_revision),
            ],
            [Put(open_txn_key(lg.topic, lg.partition, pid), entry.to_json())],
            [Get(okey)],
        )
        if res.succeeded:
            st.open[pid] = entry
            return ErrorCode.NONE
        owner = res.gets[0] if res.gets else ()
        if not owner or owner[0].value != lg.owner_value:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
    return ErrorCode.CONCURRENT_TRANSACTIONS
