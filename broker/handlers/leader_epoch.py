"""OffsetForLeaderEpoch (key 23), versions 0-4.

Each change of owner starts a new leader epoch; the owner records the epoch's start
offset under ``/logs/{t}/{p}/epochs/{epoch}`` in the same transaction that takes the
partition. The end offset of epoch E is the start of the next epoch after E (or the
high watermark for the current epoch), as clients need to detect log truncation. v0
has no epoch in the answer; the client's current leader epoch is not checked.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import OffsetForLeaderEpochResponse

from broker.handlers.registry import RequestContext
from broker.security.authz import Operation, ResourceType, allowed
from protocol.errors import ErrorCode, KafkaProtocolError

_Topic = OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult
_Part = _Topic.EpochEndOffset


async def _partition(ctx: RequestContext, topic: str, p: Any) -> Any:
    info = ctx.broker.topics.get(topic)
    if not allowed(ctx, Operation.DESCRIBE, ResourceType.TOPIC, topic):
        code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        return _Part(error_code=int(code), partition=p.partition, leader_epoch=-1, end_offset=-1)
    if info is None or not 0 <= p.partition < info.partitions:
        code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return _Part(error_code=int(code), partition=p.partition, leader_epoch=-1, end_offset=-1)
    try:
        lg = await ctx.broker.logs.get(topic, p.partition)
    except KafkaProtocolError as exc:
        return _Part(
            error_code=int(exc.code), partition=p.partition, leader_epoch=-1, end_offset=-1
        )
    epoch, end = lg.end_offset_for_epoch(p.leader_epoch)
    return _Part(error_code=0, partition=p.partition, leader_epoch=epoch, end_offset=end)


async def offset_for_leader_epoch(ctx: RequestContext, request: Any) -> Any:
    topics = []
    for t in request.topics:
        parts = [await _partition(ctx, t.topic, p) for p in t.partitions]
        topics.append(_Topic(topic=t.topic, partitions=parts))
    return OffsetForLeaderEpochResponse(throttle_time_ms=0, topics=topics)
