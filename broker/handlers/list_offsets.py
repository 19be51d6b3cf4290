"""ListOffsets (key 2), versions 0-10.

Earliest (-2) is the first offset still in the manifest, latest (-1) the committed log
end (high watermark), max timestamp (-3, v7+) the record with the largest timestamp,
earliest-local (-4) the same as earliest (every segment is "local": it is in the store),
latest-tiered (-5, v9+) offset -1 as Kafka answers for a topic without tiered storage.
v10's ``timeout_ms`` is accepted and unused (no remote reads).
A timestamp T finds the first segment whose manifest ``max_ts`` reaches T, then the
first batch whose max timestamp does, then the first record at or after T in it.
v0 answers with ``old_style_offsets`` (at most one offset). Latest under read-committed
isolation (v2+ ``isolation_level=1``) is the last stable offset (``broker.txn_partition``).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import ListOffsetsResponse

from broker.handlers.registry import RequestContext
from broker.logs import LogManager
from broker.meta.base import MetaStoreError
from broker.partition import PartitionLog
from broker.security.authz import Operation, ResourceType, allowed
from broker.txn_partition import state_of
from protocol.errors import ErrorCode, KafkaProtocolError
from protocol.records import decode_batch
from segments.format import iter_segment_batches
from segments.store import StoreError

_Topic = ListOffsetsResponse.ListOffsetsTopicResponse
_Part = _Topic.ListOffsetsPartitionResponse

LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -1, -2, -3, -4, -5


async def _by_timestamp(logs: LogManager, lg: PartitionLog, ts: int) -> tuple[int, int]:
    for seg in lg.segments:
        if seg.max_ts < ts:
            continue
        data = await logs.segment_batches(lg, seg)
        for _pos, hdr, view in iter_segment_batches(data):
            if hdr.max_timestamp < ts:
                continue
            _h, records = decode_batch(view)
            for rec in records:
                if rec.timestamp >= ts and rec.offset >= lg.log_start:
                    return rec.offset, rec.timestamp
    return -1, -1


async def _max_timestamp(logs: LogManager, lg: PartitionLog) -> tuple[int, int]:
    if not lg.segments:
        return -1, -1
    best = max(lg.segments, key=lambda s: s.max_ts)  # first of equals: earliest segment
    data = await logs.segment_batches(lg, best)
    found = (-1, -1)
    for _pos, hdr, view in iter_segment_batches(data):
        if hdr.max_timestamp == best.max_ts:
            _h, records = decode_batch(view)
            for rec in records:
                if rec.timestamp == best.max_ts:
                    return rec.offset, rec.timestamp
            found = (hdr.last_offset, hdr.max_timestamp)
    return found


async def _lookup(
    ctx: RequestContext, lg: PartitionLog, ts: int, committed: bool = False
) -> tuple[int, int]:
    if ts == LATEST:
        if committed:  # read_committed: the last stable offset
            return (await state_of(ctx.broker.logs.meta, lg)).lso(lg.hw), -1
        return lg.hw, -1
    if ts in (EARLIEST, EARLIEST_LOCAL):
        return lg.log_start, -1
    if ts == MAX_TIMESTAMP:
        return await _max_timestamp(ctx.broker.logs, lg)
    if ts == LATEST_TIERED:
        return -1, -1
    if ts < 0:
        raise KafkaProtocolError(ErrorCode.INVALID_REQUEST, f"unknown timestamp {ts}")
    return await _by_timestamp(ctx.broker.logs, lg, ts)


async def _partition(
    ctx: RequestContext, topic: str | None, p: Any, version: int, committed: bool = False
) -> Any:
    if topic and not allowed(ctx, Operation.DESCRIBE, ResourceType.TOPIC, topic):
        code = int(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
        return _Part(partition_index=p.partition_index, error_code=code, offset=-1, timestamp=-1)
    info = ctx.broker.topics.get(topic) if topic else None
    if topic is None or info is None or not 0 <= p.partition_index < info.partitions:
        return _Part(partition_index=p.partition_index, error_code=3, offset=-1, timestamp=-1)
    try:
        lg = await ctx.broker.logs.get(topic, p.partition_index)
        offset, ts = await _lookup(ctx, lg, p.timestamp, committed)
    except KafkaProtocolError as exc:
        return _Part(
            partition_index=p.partition_index, error_code=int(exc.code), offset=-1, timestamp=-1
        )
    except (MetaStoreError, StoreError) as exc:  # retriable for the client
        code = ErrorCode.NOT_LEADER_OR_FOLLOWER
        if isinstance(exc, StoreError):
            code = ErrorCode.KAFKA_STORAGE_ERROR
        return _Part(
            partition_index=p.partition_index, error_code=int(code), offset=-1, timestamp=-1
        )
    if version == 0:
        olds = [offset] if offset >= 0 and getattr(p, "max_num_offsets", 1) > 0 else []
        return _Part(partition_index=p.partition_index, error_code=0, old_style_offsets=olds)
    return _Part(
        partition_index=p.partition_index,
        error_code=0,
        timestamp=ts,
        offset=offset,
        leader_epoch=lg.epoch,
    )


async def list_offsets(ctx: RequestContext, request: Any) -> Any:
    version = ctx.header.api_version
    committed = version >= 2 and getattr(request, "isolation_level", 0) == 1
    topics = []
    for t in request.topics or ():  # a null topic list asks for nothing
        parts = [await _partition(ctx, t.name, p, version, committed) for p in t.partitions or ()]
        topics.append(_Topic(name=t.name, partitions=parts))
    return ListOffsetsResponse(throttle_time_ms=0, topics=topics)
