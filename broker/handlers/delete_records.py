"""DeleteRecords (key 21), versions 0-2.

Moves each partition's log start (low watermark) up to the requested offset; -1 means the
high watermark. Segments wholly below the new log start leave the manifest at once (their
objects are deleted after the grace period, ``broker.maintenance``); a log start inside a
segment is kept in the end key (``log_start``), so fetches below it get
OFFSET_OUT_OF_RANGE and ListOffsets earliest answers it, as in Kafka. An offset at or
below the current log start changes nothing and answers the current log start.

Errors per partition: UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER (not the owner),
OFFSET_OUT_OF_RANGE (an offset above the high watermark, or below -1),
KAFKA_STORAGE_ERROR (the metadata store failed). Deviation: ``timeout_ms`` is ignored —
every partition's change is one metadata transaction, complete when the response is sent.
"""

from __future__ import annotations

from typing import Any

from broker.handlers.registry import RequestContext
from broker.security.authz import Operation, ResourceType, allowed
from protocol.codec import response_class
from protocol.errors import ErrorCode, KafkaProtocolError

DeleteRecordsResponse: Any = response_class(21)
_Topic = DeleteRecordsResponse.DeleteRecordsTopicResult
_Part = _Topic.DeleteRecordsPartitionResult


async def _partition(ctx: RequestContext, topic: str, index: int, offset: int) -> Any:
    logs = ctx.broker.logs
    if not allowed(ctx, Operation.DELETE, ResourceType.TOPIC, topic):
        code = int(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
        return _Part(partition_index=index, low_watermark=-1, error_code=code)
    try:
        lg = await logs.get(topic, index)
        if logs.maintenance is None:
            raise KafkaProtocolError(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        low = await logs.maintenance.delete_records(lg, offset)
    except KafkaProtocolError as exc:
        return _Part(partition_index=index, low_watermark=-1, error_code=int(exc.code))
    return _Part(partition_index=index, low_watermark=low, error_code=0)


async def delete_records(ctx: RequestContext, request: Any) -> Any:
    topics = []
    for t in request.topics:
        parts = [await _partition(ctx, t.name, p.partition_index, p.offset) for p in t.partitions]
        topics.append(_Topic(name=t.name, partitions=parts))
    return DeleteRecordsResponse(throttle_time_ms=0, topics=topics)
