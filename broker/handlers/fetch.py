"""Fetch (key 1), versions 4-17 (v17 only adds a follower field, ignored here).

The high watermark is the committed log end. Whole batches are returned: a fetch offset
inside a batch returns the batch that contains it, and at least one batch even above the
byte limits (the first partition with data). Data comes from the segment cache (recent
commits are cached as they are written) or from the object store (one GET per fetch,
If-Match the manifest's ETag). When less than ``min_bytes`` is ready the request waits
on its partitions' commit events (never a sleep loop) until ``max_wait_ms``. On a
compacted partition a fetch offset that compaction removed returns the next batch
(docs/format.md, "Compacted segments"). The response
is encoded by ``protocol.fetch_fast`` as a list of buffers that reference the segment
bytes (no copy).

A partition whose data cannot be read (an object missing from the store, the store or the
metadata store unreachable) answers KAFKA_STORAGE_ERROR (retriable) alone; the other
partitions of the request are served.

Fetch sessions (v7+, KIP-227) and client fetch quotas: ``broker/fetch_sessions.py``
decides which partitions a request reads and which the response carries. Deviations: the
client's current leader epoch is not checked (owners change only through the metadata
store's fencing, docs/architecture.md, ownership). v13+ topics are named by id. A
partition answered NOT_LEADER_OR_FOLLOWER names its new owner in v12+ and the response
carries that broker's endpoint in v16+ (KIP-951, ``broker.handlers.leader_hints``).

``isolation_level=1`` (read_committed) returns whole batches below the last stable offset
(``broker.txn_partition``) and the aborted transactions they overlap; read_uncommitted
gets everything up to the high watermark and the LSO as last known to the owner.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, replace
from typing import Any

from broker.fetch_sessions import FetchContext
from broker.handlers import leader_hints
from broker.handlers.registry import RequestContext
from broker.meta.base import MetaStoreError
from broker.partition import PartitionLog
from broker.security.authz import Operation, ResourceType, allowed
from broker.txn_partition import cap_batches, loaded_state, state_of
from protocol.errors import ErrorCode, KafkaProtocolError
from protocol.fetch_fast import (
    FIRST_FLEXIBLE,
    FIRST_NODE_ENDPOINTS,
    FetchPartitionData,
    FetchResponseData,
    FetchTopicData,
)
from segments.store import StoreError

log = logging.getLogger(__name__)

_ZERO = uuid.UUID(int=0)


@dataclass(slots=True)
class _Want:
    index: int
    offset: int
    max_bytes: int
    log: PartitionLog | None
    error: ErrorCode = ErrorCode.NONE


async def _resolve(
    ctx: RequestContext, request: Any, version: int
) -> list[tuple[str, uuid.UUID, list[_Want]]]:
    topics = ctx.broker.topics
    out = []
    for t in request.topics:
        if version >= 13:
            info = topics.get_by_id(t.topic_id)
            missing = ErrorCode.UNKNOWN_TOPIC_ID
        else:
            info = topics.get(t.topic)
            missing = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        name = info.name if info else (t.topic if version < 13 else "")
        denied = bool(name) and not allowed(ctx, Operation.READ, ResourceType.TOPIC, name)
        wants = []
        for p in t.partitions:
            w = _Want(p.partition, p.fetch_offset, p.partition_max_bytes, None)
            if denied:
                w.error = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif info is None:
                w.error = missing
            else:
                try:
                    w.log = await ctx.broker.logs.get(info.name, p.partition)
                except KafkaProtocolError as exc:
                    w.error = exc.code
            wants.append(w)
        out.append((name, info.topic_id if info else getattr(t, "topic_id", _ZERO) or _ZERO, wants))
    return out


async def _collect(
    ctx: RequestContext,
    plan: list[tuple[str, uuid.UUID, list[_Want]]],
    max_bytes: int,
    committed: bool,
) -> tuple[FetchResponseData, int]:
    total = 0
    topics = []
    for name, tid, wants in plan:
        parts = []
        for w in wants:
            data, size = await _partition_data(
                ctx, name, w, (max_bytes - total, total == 0), committed
            )
            parts.append(data)
            total += size
        topics.append(FetchTopicData(name, tid, parts))
    return FetchResponseData(topics=topics), total


async def _partition_data(
    ctx: RequestContext, name: str, w: _Want, room: tuple[int, bool], committed: bool
) -> tuple[Any, int]:
    """One partition's answer and the bytes of records in it. ``room``: the bytes the
    response may still carry (at most ``w.max_bytes`` of them are read), and whether it
    is still empty (then one batch is read whatever the limits, as Kafka does)."""
    lg = w.log
    if lg is None or w.error != ErrorCode.NONE:
        return FetchPartitionData(w.index, error_code=int(w.error)), 0
    if w.offset < lg.log_start or w.offset > lg.hw:
        out_of_range = FetchPartitionData(
            w.index,
            error_code=int(ErrorCode.OFFSET_OUT_OF_RANGE),
            high_watermark=lg.hw,
            last_stable_offset=lg.hw,
            log_start_offset=lg.log_start,
        )
        return out_of_range, 0
    try:
        txns = await state_of(ctx.broker.logs.meta, lg) if committed else loaded_state(lg)
    except MetaStoreError as exc:
        log.warning("fetch of %s-%d failed: %s: %s", name, w.index, type(exc).__name__, exc)
        return FetchPartitionData(w.index, error_code=int(ErrorCode.KAFKA_STORAGE_ERROR)), 0
    lso = txns.lso(lg.hw) if txns is not None else lg.hw
    upper = lso if committed else lg.hw
    records: list[Any] = []
    budget = min(w.max_bytes, room[0])
    if w.offset < upper and (budget > 0 or room[1]):
        try:
            records = await ctx.broker.logs.read(lg, w.offset, max(budget, 1))
            if committed:
                records = cap_batches(records, upper)
        except KafkaProtocolError as exc:  # no longer the owner
            return FetchPartitionData(w.index, error_code=int(exc.code)), 0
        except (StoreError, MetaStoreError) as exc:  # this partition alone fails
            log.warning("fetch of %s-%d failed: %s: %s", name, w.index, type(exc).__name__, exc)
            return FetchPartitionData(w.index, error_code=int(ErrorCode.KAFKA_STORAGE_ERROR)), 0
    aborted = None
    if committed:
        aborted = txns.aborted_between(w.offset, upper) if txns and records else []
    data = FetchPartitionData(
        w.index,
        high_watermark=lg.hw,
        last_stable_offset=lso,
        log_start_offset=lg.log_start,
        aborted_transactions=aborted,
        records=records,
    )
    return data, sum(len(r) for r in records)


def _with_leaders(ctx: RequestContext, resp: FetchResponseData, version: int) -> FetchResponseData:
    """KIP-951: the new owner of every partition answered NOT_LEADER_OR_FOLLOWER (v12+),
    and where it is reached (v16+)."""
    if version < FIRST_FLEXIBLE:
        return resp
    hinted: list[int] = []
    for i, t in enumerate(resp.topics):
        if all(p.error_code != leader_hints.MOVED for p in t.partitions):
            continue
        parts = list(t.partitions)
        for j, p in enumerate(parts):
            leader = None
            if p.error_code == leader_hints.MOVED:
                leader = leader_hints.current_leader(ctx, t.name, p.index)
            if leader is not None:
                parts[j] = replace(p, current_leader=leader)
                hinted.append(leader[0])
        resp.topics[i] = FetchTopicData(t.name, t.topic_id, parts)
    if not hinted or version < FIRST_NODE_ENDPOINTS:
        return resp
    return replace(resp, node_endpoints=leader_hints.endpoints(ctx, hinted))


async def fetch(ctx: RequestContext, request: Any) -> Any:
    version = ctx.header.api_version
    max_bytes = request.max_bytes if request.max_bytes > 0 else 0x7FFFFFFF
    committed = getattr(request, "isolation_level", 0) == 1
    session = FetchContext(ctx, request, version)  # KIP-227 sessions, quotas
    if session.early is not None:
        return session.early
    plan = await _resolve(ctx, session.request, version)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(0, request.max_wait_ms) / 1000
    while True:
        resp, total = await _collect(ctx, plan, max_bytes, committed)
        remaining = deadline - loop.time()
        errors = any(w.error != ErrorCode.NONE for _, _, ws in plan for w in ws)
        if request.min_bytes <= 0 or total >= max(1, request.min_bytes) or remaining <= 0 or errors:
            return session.respond(_with_leaders(ctx, resp, version))
        logs = [w.log for _, _, ws in plan for w in ws if w.log is not None]
        logs += session.idle_logs()  # a session's unchanged partitions, not read
        if not logs:
            return session.respond(_with_leaders(ctx, resp, version))
        waiter: asyncio.Future[None] = loop.create_future()
        for lg in logs:
            lg.waiters.append(waiter)
        parked = loop.time()
        try:
            async with asyncio.timeout(remaining):
                await waiter
        except TimeoutError:
            pass
        finally:
            ctx.broker.logs.metrics.long_poll.observe(loop.time() - parked)
            for lg in logs:
                if waiter in lg.waiters:
                    lg.waiters.remove(waiter)
        if session.refresh():  # an unchanged partition of the session changed: read it too
            plan = await _resolve(ctx, session.request, version)
