"""DescribeTopicPartitions (key 75), version 0 (KIP-966).

Topics and their partitions as Metadata describes them (leader = the partition's owner,
replicas and ISR = the leader alone), paged: at most ``response_partition_limit``
partitions per response (capped at 2000, Kafka's ``max.request.partition.size.limit``
default), in topic-name order, starting at the request's cursor; ``next_cursor`` names the
first partition not returned (null when everything was). An empty topic list means every
topic. A requested topic that does not exist answers UNKNOWN_TOPIC_OR_PARTITION and costs
nothing against the limit. As in Kafka, a cursor topic must be one of the requested topics
(else every requested topic answers INVALID_REQUEST).

Authorization (docs/operations.md, "ACLs"): DESCRIBE on each topic. As in Kafka, a named
topic without it answers TOPIC_AUTHORIZATION_FAILED (whether it exists or not: its
existence is not disclosed) and the all-topics listing leaves it out; each topic
returned carries its KIP-430 authorized operations.

Deviations: there are no eligible leader replicas (KIP-966's ELR needs replicas), so both
ELR fields are empty lists (as Kafka sends them; the Java client needs them non-null).
"""

from __future__ import annotations

import uuid
from typing import Any

from kafka.protocol.admin import DescribeTopicPartitionsResponse

from broker.handlers.registry import RequestContext
from broker.meta.schema import TopicInfo
from broker.security.authz import Operation, ResourceType, allowed, authorized_operations
from protocol.errors import ErrorCode

_Topic = DescribeTopicPartitionsResponse.DescribeTopicPartitionsResponseTopic
_Partition = _Topic.DescribeTopicPartitionsResponsePartition
_Cursor = DescribeTopicPartitionsResponse.Cursor
_ZERO = uuid.UUID(int=0)
MAX_PARTITIONS = 2000  # Kafka's max.request.partition.size.limit default


def _partitions(ctx: RequestContext, info: TopicInfo, start: int, count: int) -> list[Any]:
    cluster = ctx.broker.cluster
    out = []
    for p in range(start, min(info.partitions, start + count)):
        leader = cluster.partition_owner(info.name, p).node_id
        out.append(
            _Partition(
                error_code=0,
                partition_index=p,
                leader_id=leader,
                leader_epoch=cluster.leader_epoch(info.name, p),
                replica_nodes=[leader],
                isr_nodes=[leader],
                eligible_leader_replicas=[],
                last_known_elr=[],
                offline_replicas=[],
            )
        )
    return out


def _bits(ops: set[int]) -> int:
    """KIP-430's int32 bitfield of operation codes."""
    return sum(1 << op for op in ops)


def _error(code: ErrorCode, name: str) -> Any:
    return _Topic(error_code=int(code), name=name, topic_id=_ZERO, partitions=[])


async def describe_topic_partitions(ctx: RequestContext, request: Any) -> Any:
    topics = ctx.broker.topics
    requested = sorted({t.name for t in request.topics})
    cursor = request.cursor
    if cursor is not None and requested and cursor.topic_name not in requested:
        return DescribeTopicPartitionsResponse(
            throttle_time_ms=0,
            topics=[_error(ErrorCode.INVALID_REQUEST, n) for n in requested],
            next_cursor=None,
        )
    denied = [
        _error(ErrorCode.TOPIC_AUTHORIZATION_FAILED, n)
        for n in requested
        if not allowed(ctx, Operation.DESCRIBE, ResourceType.TOPIC, n)
    ]
    names = requested or sorted(info.name for info in topics.all())
    names = [n for n in names if allowed(ctx, Operation.DESCRIBE, ResourceType.TOPIC, n)]
    if cursor is not None:
        names = [n for n in names if n >= cursor.topic_name]
    budget = max(1, min(request.response_partition_limit, MAX_PARTITIONS))
    out: list[Any] = []
    next_cursor = None
    for name in names:
        info = topics.get(name)
        if info is None:
            out.append(_error(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name))
            continue
        start = cursor.partition_index if cursor is not None and name == cursor.topic_name else 0
        start = max(0, start)
        if budget == 0:
            next_cursor = _Cursor(topic_name=name, partition_index=start)
            break
        parts = _partitions(ctx, info, start, budget)
        budget -= len(parts)
        out.append(
            _Topic(
                error_code=0,
                name=name,
                topic_id=info.topic_id,
                is_internal=False,
                partitions=parts,
                topic_authorized_operations=_bits(
                    authorized_operations(ctx, ResourceType.TOPIC, name)
                ),
            )
        )
        if start + len(parts) < info.partitions:
            next_cursor = _Cursor(topic_name=name, partition_index=start + len(parts))
            break
    out.extend(denied)
    return DescribeTopicPartitionsResponse(throttle_time_ms=0, topics=out, next_cursor=next_cursor)
