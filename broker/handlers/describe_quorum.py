"""DescribeQuorum (key 55), versions 0-2: the metadata quorum, as a client can use it.

There is no KRaft quorum: the metadata store (etcd, or the embedded store) plays its part.
Rather than the error a Kafka broker without KRaft gives (it does not serve the API, so
clients fail with UNSUPPORTED_VERSION), this broker answers for ``__cluster_metadata``
partition 0 what tools display (``kafka-metadata-quorum describe --status``,
kafka-python's ``describe_metadata_quorum``): the leader is the controller id every
broker reports (the lowest live node id, see DescribeCluster), the one voter; the other
live brokers are observers; the high watermark and every log end offset are the metadata
store's current revision (all brokers read the same store: there is no lag); the leader
epoch is 0 and fetch timestamps are -1 (unknown). v2 lists the voter's endpoint under
listener ``PLAINTEXT``.

Any other topic or partition answers UNKNOWN_TOPIC_OR_PARTITION, as Kafka's quorum does.
The store unreachable is a retriable top-level NOT_CONTROLLER error. Without DESCRIBE on
the cluster the answer is a top-level CLUSTER_AUTHORIZATION_FAILED, as Kafka's
controller gives (docs/operations.md, "ACLs").
"""

from __future__ import annotations

import uuid
from typing import Any

from kafka.protocol.admin import DescribeQuorumResponse

from broker.handlers.registry import RequestContext
from broker.meta.base import MetaStoreError
from broker.security.authz import Operation, allowed_cluster
from protocol.errors import ErrorCode

METADATA_TOPIC = "__cluster_metadata"
_Topic = DescribeQuorumResponse.TopicData
_Part = _Topic.PartitionData
_Replica = _Part.ReplicaState
_Node = DescribeQuorumResponse.Node
_Listener = _Node.Listener
_ZERO = uuid.UUID(int=0)


def _replica(node_id: int, offset: int) -> Any:
    return _Replica(
        replica_id=node_id,
        replica_directory_id=_ZERO,
        log_end_offset=offset,
        last_fetch_timestamp=-1,
        last_caught_up_timestamp=-1,
    )


async def describe_quorum(ctx: RequestContext, request: Any) -> Any:
    broker = ctx.broker
    cluster = broker.cluster
    if not allowed_cluster(ctx, Operation.DESCRIBE):
        return DescribeQuorumResponse(
            error_code=int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED),
            error_message=None,
            topics=[],
            nodes=[],
        )
    try:
        revision = (await broker.logs.meta.txn([], [])).revision
    except MetaStoreError:
        return DescribeQuorumResponse(
            error_code=int(ErrorCode.NOT_CONTROLLER),
            error_message="metadata store unavailable",
            topics=[],
            nodes=[],
        )
    leader = cluster.controller_id()
    topics = []
    for t in request.topics:
        parts = []
        for p in t.partitions:
            if t.topic_name != METADATA_TOPIC or p.partition_index != 0:
                parts.append(
                    _Part(
                        partition_index=p.partition_index,
                        error_code=int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                        leader_id=-1,
                        leader_epoch=-1,
                        high_watermark=-1,
                        current_voters=[],
                        observers=[],
                    )
                )
                continue
            observers = [b.node_id for b in cluster.brokers() if b.node_id != leader]
            parts.append(
                _Part(
                    partition_index=0,
                    error_code=0,
                    error_message=None,
                    leader_id=leader,
                    leader_epoch=0,
                    high_watermark=revision,
                    current_voters=[_replica(leader, revision)],
                    observers=[_replica(n, revision) for n in observers],
                )
            )
        topics.append(_Topic(topic_name=t.topic_name, partitions=parts))
    voter = cluster.broker(leader)
    nodes = []
    if voter is not None:
        listener = _Listener(name="PLAINTEXT", host=voter.host, port=voter.port)
        nodes.append(_Node(node_id=leader, listeners=[listener]))
    return DescribeQuorumResponse(error_code=0, error_message=None, topics=topics, nodes=nodes)
