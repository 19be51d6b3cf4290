"""Transaction APIs, on ``broker.txn_coordinator.TxnCoordinator`` (docs/architecture.md,
"Transactions").

Supported versions:

- InitProducerId (22) v0-4 with a transactional id: ``init_transactional`` (the
  idempotent case stays in ``producer_ids.py``). A timeout above
  ``transaction_max_timeout_ms`` gets INVALID_TRANSACTION_TIMEOUT.
- AddPartitionsToTxn (24) v0-3 (v4+ is Kafka's broker-to-broker verification form, which
  clients do not send). Unknown topics or partitions get UNKNOWN_TOPIC_OR_PARTITION and
  the rest of the request OPERATION_NOT_ATTEMPTED, as in Kafka.
- AddOffsetsToTxn (25) v0-3, EndTxn (26) v0-4, TxnOffsetCommit (28) v0-3: transactions
  version 1 (EndTxn v5 and the KIP-890 epoch bump per transaction are not served).
  TxnOffsetCommit v3 checks the member id and generation it names against the group
  (KIP-447: UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, FENCED_INSTANCE_ID).
- DescribeTransactions (65) v0, ListTransactions (66) v0-1 (v1 duration filter).

Deviations: EndTxn answers once the markers are written (up to 15 s; Kafka answers once
the decision is durable and writes markers afterwards): the next transaction never
meets CONCURRENT_TRANSACTIONS. A transactional id this
broker does not coordinate gets NOT_COORDINATOR; metadata-store failures answer
COORDINATOR_NOT_AVAILABLE (retriable).

Authorization (docs/operations.md, "ACLs"), Kafka's checks in Kafka's order: WRITE on the
transactional id for InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn and
TxnOffsetCommit (TRANSACTIONAL_ID_AUTHORIZATION_FAILED for the whole request); then
AddPartitionsToTxn WRITE on each topic (TOPIC_AUTHORIZATION_FAILED, the rest
OPERATION_NOT_ATTEMPTED), AddOffsetsToTxn READ on the group, TxnOffsetCommit READ on the
group then READ on each topic (per topic). DescribeTransactions needs DESCRIBE on each id
and lists only the topics the principal may DESCRIBE; ListTransactions lists only ids
it may DESCRIBE.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from kafka.protocol.admin.transactions import (
    DescribeTransactionsResponse,
    ListTransactionsResponse,
)
from kafka.protocol.producer.transaction import (
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnResponse,
    EndTxnResponse,
    InitProducerIdResponse,
    TxnOffsetCommitResponse,
)

from broker.handlers.groups import coordinator, group_error
from broker.handlers.registry import Handler, RequestContext
from broker.security.authz import Operation, ResourceType, allowed
from broker.txn_coordinator import TxnCoordinator, now_ms
from groupcoord import OffsetRecord
from protocol.errors import ErrorCode
from txncoord import TxnState

log = logging.getLogger(__name__)

_TopicResult = AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult
_PartResult = _TopicResult.AddPartitionsToTxnPartitionResult
_OffTopic = TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic
_OffPart = _OffTopic.TxnOffsetCommitResponsePartition
_Described = DescribeTransactionsResponse.TransactionState
_DescribedTopic = _Described.TopicData
_Listed = ListTransactionsResponse.TransactionState

Fallback = Callable[[RequestContext, Any, ErrorCode], Any]


def guarded(fallback: Fallback) -> Callable[[Handler], Handler]:
    """Store failures become COORDINATOR_NOT_AVAILABLE (retriable), never a closed
    connection."""

    def wrap(fn: Handler) -> Handler:
        @functools.wraps(fn)
        async def handle(ctx: RequestContext, request: Any) -> Any:
            try:
                return await fn(ctx, request)
            except Exception as exc:  # noqa: BLE001 - store/network failure
                log.warning("%s failed for %s: %r", fn.__name__, ctx.peer, exc)
                return fallback(ctx, request, ErrorCode.COORDINATOR_NOT_AVAILABLE)

        return handle

    return wrap


def _may_write(ctx: RequestContext, txn_id: str | None) -> bool:
    return allowed(ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, txn_id or "")


def _coordinator(
    ctx: RequestContext, txn_id: str | None, describe: bool = False
) -> tuple[TxnCoordinator | None, ErrorCode]:
    """The coordinator for a request that writes ``txn_id`` (WRITE on it checked first;
    ``describe``: the caller checked DESCRIBE instead)."""
    if not describe and not _may_write(ctx, txn_id):
        return None, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    txns = ctx.broker.txns
    if txns is None:
        return None, ErrorCode.COORDINATOR_NOT_AVAILABLE
    if not txn_id:
        return None, ErrorCode.INVALID_REQUEST
    if not ctx.broker.cluster.lease_valid():
        return None, ErrorCode.COORDINATOR_NOT_AVAILABLE
    if not txns.owns(txn_id):
        return None, ErrorCode.NOT_COORDINATOR
    return txns, ErrorCode.NONE


# ---- InitProducerId (transactional) ----


def _init_response(err: ErrorCode, pid: int = -1, epoch: int = -1) -> Any:
    return InitProducerIdResponse(
        throttle_time_ms=0, error_code=int(err), producer_id=pid, producer_epoch=epoch
    )


@guarded(lambda ctx, r, e: _init_response(e))
async def init_transactional(ctx: RequestContext, request: Any) -> Any:
    txns, err = _coordinator(ctx, request.transactional_id)
    if txns is None:
        return _init_response(err)
    version = ctx.header.api_version
    pid = getattr(request, "producer_id", -1) if version >= 3 else -1
    epoch = getattr(request, "producer_epoch", -1) if version >= 3 else -1
    err, pid, epoch = await txns.init_producer_id(
        request.transactional_id, request.transaction_timeout_ms, pid, epoch
    )
    return _init_response(err, pid, epoch)


# ---- AddPartitionsToTxn ----


def _add_partitions_response(topics: Any, errors: dict[tuple[str, int], ErrorCode]) -> Any:
    results = [
        _TopicResult(
            name=t.name,
            results_by_partition=[
                _PartResult(partition_index=p, partition_error_code=int(errors[(t.name, p)]))
                for p in t.partitions or []
            ],
        )
        for t in topics or []
    ]
    return AddPartitionsToTxnResponse(throttle_time_ms=0, results_by_topic_v3_and_below=results)


def _all(topics: Any, err: ErrorCode) -> dict[tuple[str, int], ErrorCode]:
    return {(t.name, p): err for t in topics or [] for p in t.partitions or []}


@guarded(
    lambda ctx, r, e: _add_partitions_response(
        r.v3_and_below_topics, _all(r.v3_and_below_topics, e)
    )
)
async def add_partitions_to_txn(ctx: RequestContext, request: Any) -> Any:
    topics = request.v3_and_below_topics
    txns, err = _coordinator(ctx, request.v3_and_below_transactional_id)
    if txns is None:
        return _add_partitions_response(topics, _all(topics, err))
    errors: dict[tuple[str, int], ErrorCode] = {}
    for t in topics or []:
        info = ctx.broker.topics.get(t.name)
        may = allowed(ctx, Operation.WRITE, ResourceType.TOPIC, t.name)
        for p in t.partitions or []:
            known = info is not None and 0 <= p < info.partitions
            errors[(t.name, p)] = (
                ErrorCode.TOPIC_AUTHORIZATION_FAILED
                if not may
                else ErrorCode.NONE
                if known
                else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            )
    if any(e != ErrorCode.NONE for e in errors.values()):
        errors = {
            tp: (e if e != ErrorCode.NONE else ErrorCode.OPERATION_NOT_ATTEMPTED)
            for tp, e in errors.items()
        }
        return _add_partitions_response(topics, errors)
    err = await txns.add_partitions(
        request.v3_and_below_transactional_id,
        request.v3_and_below_producer_id,
        request.v3_and_below_producer_epoch,
        frozenset(errors),
    )
    return _add_partitions_response(topics, dict.fromkeys(errors, err))


# ---- AddOffsetsToTxn / EndTxn ----


def _plain(cls: Any) -> Fallback:
    return lambda ctx, r, e: cls(throttle_time_ms=0, error_code=int(e))


@guarded(_plain(AddOffsetsToTxnResponse))
async def add_offsets_to_txn(ctx: RequestContext, request: Any) -> Any:
    txns, err = _coordinator(ctx, request.transactional_id)
    if txns is not None and not allowed(ctx, Operation.READ, ResourceType.GROUP, request.group_id):
        txns, err = None, ErrorCode.GROUP_AUTHORIZATION_FAILED
    if txns is not None:
        err = await txns.add_offsets(
            request.transactional_id, request.producer_id, request.producer_epoch, request.group_id
        )
    return AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=int(err))


@guarded(_plain(EndTxnResponse))
async def end_txn(ctx: RequestContext, request: Any) -> Any:
    txns, err = _coordinator(ctx, request.transactional_id)
    if txns is not None:
        err = await txns.end_txn(
            request.transactional_id,
            request.producer_id,
            request.producer_epoch,
            bool(request.committed),
        )
    return EndTxnResponse(throttle_time_ms=0, error_code=int(err))


# ---- TxnOffsetCommit (sent to the group's coordinator) ----


def _offsets_response(request: Any, errors: dict[tuple[str, int], ErrorCode]) -> Any:
    topics = [
        _OffTopic(
            name=t.name,
            partitions=[
                _OffPart(
                    partition_index=p.partition_index,
                    error_code=int(errors[(t.name, p.partition_index)]),
                )
                for p in t.partitions or []
            ],
        )
        for t in request.topics or []
    ]
    return TxnOffsetCommitResponse(throttle_time_ms=0, topics=topics)


def _offset_keys(request: Any, err: ErrorCode) -> dict[tuple[str, int], ErrorCode]:
    return {
        (t.name, p.partition_index): err for t in request.topics or [] for p in t.partitions or []
    }


@guarded(lambda ctx, r, e: _offsets_response(r, _offset_keys(r, e)))
async def txn_offset_commit(ctx: RequestContext, request: Any) -> Any:
    err = (
        group_error(ctx, request.group_id)
        if _may_write(ctx, request.transactional_id)
        else ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    )
    txns = ctx.broker.txns
    if err is None and txns is None:
        err = ErrorCode.COORDINATOR_NOT_AVAILABLE
    if err is not None or txns is None:
        return _offsets_response(request, _offset_keys(request, err or ErrorCode.NONE))
    version = ctx.header.api_version
    if version >= 3:  # KIP-447: only the group's current member may commit
        err = await coordinator(ctx).check_txn_member(
            request.group_id,
            request.generation_id,
            request.member_id or "",
            request.group_instance_id,
        )
        if err != ErrorCode.NONE:
            return _offsets_response(request, _offset_keys(request, err))
    errors: dict[tuple[str, int], ErrorCode] = {}
    rows: list[tuple[str, int, bytes]] = []
    stamp = now_ms()
    for t in request.topics or []:
        info = ctx.broker.topics.get(t.name)
        may = allowed(ctx, Operation.READ, ResourceType.TOPIC, t.name)
        for p in t.partitions or []:
            if not may:
                errors[(t.name, p.partition_index)] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                continue
            if info is None or not 0 <= p.partition_index < info.partitions:
                errors[(t.name, p.partition_index)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            epoch = getattr(p, "committed_leader_epoch", -1) if version >= 2 else -1
            rec = OffsetRecord(p.committed_offset, epoch, p.committed_metadata, stamp)
            rows.append((t.name, p.partition_index, rec.to_json()))
            errors[(t.name, p.partition_index)] = ErrorCode.NONE
    if rows:
        err = await txns.txn_offset_commit(
            request.transactional_id,
            request.producer_id,
            request.producer_epoch,
            request.group_id,
            rows,
        )
        errors = {tp: (err if e == ErrorCode.NONE else e) for tp, e in errors.items()}
    return _offsets_response(request, errors)


# ---- DescribeTransactions / ListTransactions ----


async def describe_transactions(ctx: RequestContext, request: Any) -> Any:
    states = []
    for tid in request.transactional_ids or []:
        if allowed(ctx, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, tid):
            txns, err = _coordinator(ctx, tid, describe=True)
        else:
            txns, err = None, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        rec = None
        if txns is not None:
            try:
                rec = (await txns.load(tid)).record
            except Exception as exc:  # noqa: BLE001 - store failure: retriable
                log.warning("describing transaction %r failed: %r", tid, exc)
                err = ErrorCode.COORDINATOR_NOT_AVAILABLE
            else:
                err = ErrorCode.NONE if rec is not None else ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
        if rec is None:
            states.append(
                _Described(
                    error_code=int(err),
                    transactional_id=tid,
                    transaction_state="",
                    transaction_timeout_ms=0,
                    transaction_start_time_ms=-1,
                    producer_id=-1,
                    producer_epoch=-1,
                    topics=[],
                )
            )
            continue
        by_topic: dict[str, list[int]] = {}
        for topic, p in sorted(rec.partitions):
            if allowed(ctx, Operation.DESCRIBE, ResourceType.TOPIC, topic):
                by_topic.setdefault(topic, []).append(p)
        states.append(
            _Described(
                error_code=0,
                transactional_id=tid,
                transaction_state=rec.state.value,
                transaction_timeout_ms=rec.timeout_ms,
                transaction_start_time_ms=rec.started_ms,
                producer_id=rec.producer_id,
                producer_epoch=rec.producer_epoch,
                topics=[_DescribedTopic(topic=t, partitions=ps) for t, ps in by_topic.items()],
            )
        )
    return DescribeTransactionsResponse(throttle_time_ms=0, transaction_states=states)


async def list_transactions(ctx: RequestContext, request: Any) -> Any:
    known = {s.value for s in TxnState}
    wanted = set(request.state_filters or [])
    unknown = sorted(wanted - known)
    pids = set(request.producer_id_filters or [])
    duration = getattr(request, "duration_filter", -1) if ctx.header.api_version >= 1 else -1
    txns = ctx.broker.txns
    if txns is None:
        return ListTransactionsResponse(
            throttle_time_ms=0,
            error_code=int(ErrorCode.COORDINATOR_NOT_AVAILABLE),
            unknown_state_filters=unknown,
            transaction_states=[],
        )
    try:
        listed = await txns.list_all()
    except Exception as exc:  # noqa: BLE001 - store failure: retriable
        log.warning("listing transactions failed: %r", exc)
        return ListTransactionsResponse(
            throttle_time_ms=0,
            error_code=int(ErrorCode.COORDINATOR_NOT_AVAILABLE),
            unknown_state_filters=unknown,
            transaction_states=[],
        )
    now = now_ms()
    out = []
    for tid, rec in listed:
        if not txns.owns(tid):
            continue  # as in Kafka: each coordinator lists its own
        if not allowed(ctx, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, tid):
            continue
        if wanted and rec.state.value not in wanted:
            continue
        if pids and rec.producer_id not in pids:
            continue
        if duration is not None and duration >= 0:
            if rec.state != TxnState.ONGOING or now - rec.started_ms < duration:
                continue
        out.append(
            _Listed(
                transactional_id=tid, producer_id=rec.producer_id, transaction_state=rec.state.value
            )
        )
    return ListTransactionsResponse(
        throttle_time_ms=0, error_code=0, unknown_state_filters=unknown, transaction_states=out
    )
