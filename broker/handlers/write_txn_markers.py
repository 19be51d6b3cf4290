"""WriteTxnMarkers (key 27), versions 0-2: commit or abort markers written on request,
as Kafka's admin ``abortTransaction`` (KIP-664, ``kafka-transactions.sh abort``) sends
them to resolve a hanging transaction.

Each partition's owner writes the marker as it writes the markers its coordinators hand
off through the metadata store (``broker.txn_markers.MarkerWriter.write``, docs/
architecture.md "Transactions"): a control batch through the normal write path, then the
partition's open transaction closed (and, for an abort, its aborted-transaction entry
stored) under the owner guard. A producer with no open transaction on the partition gets
nothing appended and NONE (the marker would change nothing). Per partition: a marker
older than the producer's open transaction answers INVALID_PRODUCER_EPOCH, a partition
this broker does not own NOT_LEADER_OR_FOLLOWER, an unknown one
UNKNOWN_TOPIC_OR_PARTITION, a failed append or metadata store error
KAFKA_STORAGE_ERROR (retriable).

Deviations: our coordinators never send this API (they hand markers off through the
metadata store), so the coordinator epoch is recorded in the marker but not checked, and
v2's TransactionVersion is ignored.

Authorization (docs/operations.md, "ACLs"), as in Kafka: CLUSTER_ACTION on the cluster,
else every partition answers CLUSTER_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

import logging
from typing import Any

from kafka.protocol.producer.transaction import WriteTxnMarkersResponse

from broker.handlers.registry import RequestContext
from broker.meta.base import MetaStoreError
from broker.meta.schema import MarkerRequest
from broker.partition import AppendError
from broker.security.authz import Operation, allowed_cluster
from protocol.errors import ErrorCode, KafkaProtocolError

log = logging.getLogger(__name__)

_Result = WriteTxnMarkersResponse.WritableTxnMarkerResult
_Topic = _Result.WritableTxnMarkerTopicResult
_Part = _Topic.WritableTxnMarkerPartitionResult


async def _partition(ctx: RequestContext, req: MarkerRequest, topic: str, p: int) -> ErrorCode:
    info = ctx.broker.topics.get(topic)
    if info is None or not 0 <= p < info.partitions:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    writer = ctx.broker.markers
    if writer is None:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    try:
        lg = await ctx.broker.logs.get(topic, p)
        return ErrorCode(await writer.write(lg, req))
    except KafkaProtocolError as exc:
        return ErrorCode(exc.code)
    except (AppendError, MetaStoreError) as exc:
        log.warning("WriteTxnMarkers on %s-%d failed: %r", topic, p, exc)
        return ErrorCode.KAFKA_STORAGE_ERROR


async def write_txn_markers(ctx: RequestContext, request: Any) -> Any:
    permitted = allowed_cluster(ctx, Operation.CLUSTER_ACTION)
    results = []
    for m in request.markers:
        marker = MarkerRequest(
            m.producer_id, m.producer_epoch, bool(m.transaction_result), m.coordinator_epoch
        )
        topics = []
        for t in m.topics:
            parts = []
            for p in t.partition_indexes:
                if permitted:
                    code = await _partition(ctx, marker, t.name, p)
                else:
                    code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
                parts.append(_Part(partition_index=p, error_code=int(code)))
            topics.append(_Topic(name=t.name, partitions=parts))
        results.append(_Result(producer_id=m.producer_id, topics=topics))
    return WriteTxnMarkersResponse(markers=results)
