"""Produce (key 0), versions 0-11.

A partition answered NOT_LEADER_OR_FOLLOWER names its new owner in v10+ (KIP-951,
``broker.handlers.leader_hints``).

Decoded by ``protocol.produce_fast`` without copying record bytes; every batch is
validated by ``protocol.validate`` (framing, CRC-32C, the header against the records
actually present, decompressing compressed ones, producer fields, control batches,
timestamps; maxTimestamp recomputed) before any of the partition's batches is appended,
so a bad batch never changes the partition: the partition answers CORRUPT_MESSAGE,
INVALID_RECORD (v8+; CORRUPT_MESSAGE before) with ``record_errors`` naming the record
(also for a record without a key on a compacted topic), or INVALID_TIMESTAMP.
Accepted batches are appended in arrival order; the response is
*deferred* until the flush cycle commits them (docs/architecture.md, the write path), so
a connection keeps
reading while its produces wait. acks=0 gets no response.

Transactional batches are admitted by ``broker.txn_produce`` first (the producer's
transaction must be ongoing with this partition in it; docs/architecture.md,
"Transactions"); a refused one leaves the partition unchanged. With an authorizer, a
request carrying transactional batches needs WRITE on its transactional id, else every
partition answers TRANSACTIONAL_ID_AUTHORIZATION_FAILED (as in Kafka).

Deviations: v0-2 magic 0/1 message sets are converted to v2 batches on arrival (one
copy). The request
timeout bounds the wait for the commit; past it the partition answers
REQUEST_TIMED_OUT (the commit may still land; idempotent retries are deduplicated).
Client quotas (``broker/quotas.py``): the request's record bytes count against the
client's produce byte rate; over it, ``throttle_time_ms`` says how long the client must
wait and the connection mutes that long after the response.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from broker import quotas
from broker.handlers import leader_hints
from broker.handlers.registry import Encoded, RequestContext, handler_failed
from broker.meta.base import MetaStoreError
from broker.meta.schema import TopicInfo
from broker.partition import AppendError, PartitionLog
from broker.security.authz import (
    Operation,
    ResourceType,
    allowed,
    authorizer_of,
    may_create_topic,
)
from broker.topic_validation import is_valid_topic_name
from broker.txn_produce import append_transactional, transactional_header
from protocol.batch import (
    BatchHeader,
    CorruptBatchError,
    iter_batches,
    read_header,
    set_log_append_time,
    verify_crc,
)
from protocol.compaction import require_keys
from protocol.errors import ErrorCode, KafkaProtocolError
from protocol.legacy import convert_message_set, is_legacy
from protocol.produce_fast import (
    FIRST_LEADER_HINTS,
    ProducePartitionData,
    ProducePartitionResult,
    ProduceRequestData,
    ProduceTopicResult,
    decode_produce,
    encode_produce_response,
)
from protocol.validate import (
    BatchRejected,
    TimestampPolicy,
    check_header,
    decompressed_bound,
    validate_batch,
)

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Outcome:
    index: int
    error: ErrorCode = ErrorCode.NONE
    base_offset: int = -1
    log_append_time: int = -1
    log_start: int = -1
    waits: list[asyncio.Future[None]] | None = None
    message: str | None = None
    record_errors: list[tuple[int, str | None]] | None = None


def decode(body: memoryview, version: int) -> ProduceRequestData:
    """The route's decoder: the zero-copy Produce decoder of ``protocol.produce_fast``."""
    return decode_produce(body, version)


async def _topic(ctx: RequestContext, name: str) -> tuple[TopicInfo | None, ErrorCode]:
    if not allowed(ctx, Operation.WRITE, ResourceType.TOPIC, name):
        return None, ErrorCode.TOPIC_AUTHORIZATION_FAILED
    topics = ctx.broker.topics
    info = topics.get(name)
    if info is None and ctx.broker.config.auto_create_topics and may_create_topic(ctx, name):
        info = await topics.ensure(name)
    if info is not None:
        return info, ErrorCode.NONE
    if not is_valid_topic_name(name):
        return None, ErrorCode.INVALID_TOPIC_EXCEPTION
    return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def validate_records(
    records: memoryview, policy: TimestampPolicy, max_bytes: int, full: bool
) -> list[tuple[BatchHeader, memoryview]]:
    """Frame and check every batch (protocol.validate); raises BatchRejected. Returns the
    headers to append (maxTimestamp recomputed from the records)."""
    if len(records) > max_bytes:
        raise BatchRejected(ErrorCode.MESSAGE_TOO_LARGE, "record set larger than max.message.bytes")
    try:
        batches = list(iter_batches(records))
    except CorruptBatchError as exc:
        raise BatchRejected(ErrorCode.CORRUPT_MESSAGE, str(exc)) from exc
    if not batches:
        raise BatchRejected(ErrorCode.CORRUPT_MESSAGE, "no record batch")
    now = int(time.time() * 1000)
    out = []
    for i, (hdr, view) in enumerate(batches):
        try:
            if full:
                bound = decompressed_bound(max_bytes)
                hdr = validate_batch(hdr, view, policy, now, max_uncompressed=bound)
            else:  # benchmark switch: the pre-issue-16 header checks only
                if not verify_crc(view, hdr):
                    raise BatchRejected(ErrorCode.CORRUPT_MESSAGE, "record batch CRC mismatch")
                check_header(hdr)
        except BatchRejected as exc:
            exc.message = f"batch {i}: {exc.message}"
            raise
        out.append((hdr, view))
    return out


def _rejected(out: _Outcome, exc: BatchRejected, version: int) -> _Outcome:
    """Kafka's answer to a rejected record set for this Produce version."""
    code = exc.code
    if code == ErrorCode.INVALID_RECORD and version < 8:
        code = ErrorCode.CORRUPT_MESSAGE  # INVALID_RECORD came with KIP-467 (v8)
    out.error, out.message = code, exc.message
    if exc.record_index is not None:
        out.record_errors = [(exc.record_index, exc.message)]
    return out


def _append(
    ctx: RequestContext, lg: PartitionLog, info: TopicInfo, part: ProducePartitionData
) -> _Outcome:
    out = _Outcome(part.index, log_start=lg.log_start)
    records = part.records
    if records is None or len(records) == 0:
        out.error = ErrorCode.CORRUPT_MESSAGE
        return out
    checks = ctx.broker.topics.produce_policy(info)
    policy = checks.timestamps
    try:
        if is_legacy(records):
            records = memoryview(bytearray(convert_message_set(records)))
        batches = validate_records(
            records, policy, checks.max_bytes, ctx.broker.config.validate_records
        )
        if checks.compacted:
            require_keys(batches)  # INVALID_RECORD (CORRUPT_MESSAGE before v8)
    except KafkaProtocolError as exc:
        out.error, out.message = exc.code, exc.message or None
        return out
    except BatchRejected as exc:
        return _rejected(out, exc, ctx.header.api_version)
    append_time = policy.log_append_time
    now = int(time.time() * 1000)
    waits: list[asyncio.Future[None]] = []
    nbytes = 0
    for i, (hdr, view) in enumerate(batches):
        if append_time:
            set_log_append_time(view, now)
            hdr = read_header(view)  # the stamped maxTimestamp, not the producer's
        res = lg.append(hdr, view)
        if res.error != ErrorCode.NONE:
            out.error = res.error
            break
        if i == 0:
            out.base_offset = res.base_offset
        if res.done is not None:
            waits.append(res.done)
        nbytes += len(view)
    if nbytes:
        ctx.broker.logs.appended(lg, nbytes)
    out.waits = waits
    out.log_append_time = now if append_time else -1
    return out


async def _partition(
    ctx: RequestContext,
    name: str,
    info: TopicInfo | None,
    err: ErrorCode,
    part: Any,
    txn_id: str | None = None,
) -> _Outcome:
    if info is None:
        return _Outcome(part.index, err)
    if not 0 <= part.index < info.partitions:
        return _Outcome(part.index, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    try:
        lg = await ctx.broker.logs.get(name, part.index)
    except KafkaProtocolError as exc:
        return _Outcome(part.index, exc.code)
    except MetaStoreError as exc:  # e.g. our lease is gone: not the leader, retriable
        log.warning("%s-%d unavailable: %s", name, part.index, exc)
        return _Outcome(part.index, ErrorCode.NOT_LEADER_OR_FOLLOWER)
    try:
        txn = transactional_header(part.records)
        if txn is not None:
            return await append_transactional(
                ctx.broker.logs.meta,
                lg,
                txn_id,
                part.records,
                txn,
                lambda: _append(ctx, lg, info, part),
                lambda code: _Outcome(part.index, code),
            )
        return _append(ctx, lg, info, part)
    except Exception as exc:  # a bug: this partition fails, the others are answered
        handler_failed(0, ctx.header.api_version, exc)
        return _Outcome(part.index, ErrorCode.UNKNOWN_SERVER_ERROR)


def _txn_denied(ctx: RequestContext, request: ProduceRequestData) -> bool:
    """Transactional batches without WRITE on the transactional id (only looked for when
    an authorizer is on)."""
    if authorizer_of(ctx) is None:
        return False
    tid = request.transactional_id
    if tid is not None and allowed(ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid):
        return False
    return any(
        transactional_header(p.records) is not None for t in request.topics for p in t.partitions
    )


async def produce(ctx: RequestContext, request: ProduceRequestData) -> Any:
    results: list[tuple[str, list[_Outcome]]] = []
    if request.acks not in (0, 1, -1) or _txn_denied(ctx, request):
        code = (
            ErrorCode.INVALID_REQUIRED_ACKS
            if request.acks not in (0, 1, -1)
            else ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        )
        for t in request.topics:
            results.append((t.name, [_Outcome(p.index, code) for p in t.partitions]))
    else:
        for t in request.topics:
            info, err = await _topic(ctx, t.name)
            tid = request.transactional_id
            if tid is None:
                outs = [await _partition(ctx, t.name, info, err, p) for p in t.partitions]
            else:  # admissions wait on the metadata store: partitions side by side
                parts = [_partition(ctx, t.name, info, err, p, tid) for p in t.partitions]
                outs = list(await asyncio.gather(*parts))
            results.append((t.name, outs))
    nbytes = sum(p.records.nbytes for t in request.topics for p in t.partitions if p.records)
    throttle_ms = quotas.throttle(ctx, quotas.PRODUCE, nbytes)  # client quotas (issue 12)
    if request.acks == 0:
        return _silently(results)
    return _respond(ctx, results, request.timeout_ms, throttle_ms)


async def _silently(results: list[tuple[str, list[_Outcome]]]) -> None:
    """acks=0: no response, but the request's bytes stay counted against the
    connection's in-flight limit until its batches are committed (or failed)."""
    waits = [w for _, outs in results for o in outs for w in (o.waits or ())]
    if waits:
        await asyncio.wait(waits)
    return None


async def _respond(
    ctx: RequestContext,
    results: list[tuple[str, list[_Outcome]]],
    timeout_ms: int,
    throttle_ms: int = 0,
) -> Any:
    version = ctx.header.api_version
    waits = [w for _, outs in results for o in outs for w in (o.waits or ())]
    if waits:
        await asyncio.wait(waits, timeout=max(timeout_ms, 1000) / 1000)
    topics = []
    hinted: list[int] = []  # leaders named in the response (KIP-951)
    for name, outs in results:
        parts = []
        for o in outs:
            code = o.error
            if code == ErrorCode.NONE:
                code = _wait_result(o.waits or [])
            ok = code == ErrorCode.NONE
            leader = None
            if code == leader_hints.MOVED and version >= FIRST_LEADER_HINTS:
                leader = leader_hints.current_leader(ctx, name, o.index)
                if leader is not None:
                    hinted.append(leader[0])
            parts.append(
                ProducePartitionResult(
                    index=o.index,
                    error_code=int(code),
                    base_offset=o.base_offset if ok else -1,
                    log_append_time_ms=o.log_append_time if ok else -1,
                    log_start_offset=o.log_start,
                    error_message=o.message,
                    record_errors=o.record_errors or (),
                    current_leader=leader,
                )
            )
        topics.append(ProduceTopicResult(name, parts))
    nodes = leader_hints.endpoints(ctx, hinted) if hinted else ()
    return Encoded(encode_produce_response(version, topics, throttle_ms, nodes), topics)


def _wait_result(waits: list[asyncio.Future[None]]) -> ErrorCode:
    for w in waits:
        if not w.done():
            return ErrorCode.REQUEST_TIMED_OUT
        exc = w.exception()
        if isinstance(exc, AppendError):
            return exc.code
        if exc is not None:
            return ErrorCode.KAFKA_STORAGE_ERROR
    return ErrorCode.NONE
