"""DescribeProducers (key 61), version 0.

The idempotent producers a partition's owner tracks (``broker/producers.py``): producer
id, epoch and last sequence, from the batches appended since the partition was taken and
the newest segments' batch headers read when it was. A partition this broker does not
own answers NOT_LEADER_OR_FOLLOWER (the client asks the leader Metadata names), an
unknown one UNKNOWN_TOPIC_OR_PARTITION.

Deviations: the last timestamp is the broker's wall-clock time of the producer's last
append (the commit time of its segment, for a producer read back at takeover), not the
batch's own max timestamp, which the client sets; expiry
(``producer.id.expiration.ms``) counts from it. The coordinator epoch is not tracked
(-1). The current transaction start offset is the open transaction's first offset as the owner
recorded it (a lower bound: the committed log end when its first batch was admitted).

Authorization (docs/operations.md, "ACLs"), as in Kafka: READ on the topic, else each of
its partitions answers TOPIC_AUTHORIZATION_FAILED (checked before existence).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import DescribeProducersResponse

from broker.handlers.registry import RequestContext
from broker.meta.base import MetaStoreError
from broker.security.authz import Operation, ResourceType, allowed
from broker.txn_partition import state_of
from protocol.errors import ErrorCode, KafkaProtocolError

_Topic = DescribeProducersResponse.TopicResponse
_Part = _Topic.PartitionResponse
_State = _Part.ProducerState


async def _partition(ctx: RequestContext, topic: str, p: int) -> Any:
    if not allowed(ctx, Operation.READ, ResourceType.TOPIC, topic):
        code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        return _Part(partition_index=p, error_code=int(code), active_producers=[])
    info = ctx.broker.topics.get(topic)
    if info is None or not 0 <= p < info.partitions:
        code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return _Part(partition_index=p, error_code=int(code), active_producers=[])
    try:
        lg = await ctx.broker.logs.get(topic, p)
    except KafkaProtocolError as exc:
        return _Part(
            partition_index=p,
            error_code=int(exc.code),
            error_message=exc.message or None,
            active_producers=[],
        )
    try:  # open transactions (broker/txn_partition.py)
        txns = await state_of(ctx.broker.logs.meta, lg)
    except MetaStoreError as exc:  # retriable
        code = ErrorCode.KAFKA_STORAGE_ERROR
        return _Part(
            partition_index=p, error_code=int(code), error_message=str(exc), active_producers=[]
        )
    states = [
        _State(
            producer_id=pid,
            producer_epoch=epoch,
            last_sequence=last_seq,
            last_timestamp=lg.producers.last_write(pid),
            coordinator_epoch=-1,
            current_txn_start_offset=txns.open[pid].first if pid in txns.open else -1,
        )
        for pid, epoch, last_seq in sorted(lg.producers.describe())
    ]
    return _Part(partition_index=p, error_code=0, error_message=None, active_producers=states)


async def describe_producers(ctx: RequestContext, request: Any) -> Any:
    topics = [
        _Topic(
            name=t.name,
            partitions=[await _partition(ctx, t.name, p) for p in t.partition_indexes],
        )
        for t in request.topics
    ]
    return DescribeProducersResponse(throttle_time_ms=0, topics=topics)
