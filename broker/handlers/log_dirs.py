"""Log directories: DescribeLogDirs (35) v1-4, AlterReplicaLogDirs (34) v1-2.

The object store is this broker's one log dir, named by the store URL without
credentials or query plus the namespace (``s3://bucket/prefix/default``). A broker
"hosts" the partitions it owns (docs/architecture.md, ownership): DescribeLogDirs lists
those, each with its size from the manifest (the committed segments' bytes; a partition
this broker has not opened yet is read from the metadata store), offset lag 0 (there are
no followers) and never a future replica. A null topic list means every topic; unknown
topics are left out, as Kafka does. Total and usable bytes are -1 (unknown: an object
store has no volume size). v5 (KIP-1066 cordoning) is not served: kafka-python would take
it for a Kafka 4.3 broker.

AlterReplicaLogDirs answers as a broker with that single log dir: moving a hosted
partition to it succeeds (it is already there), any other path is LOG_DIR_NOT_FOUND, a
partition this broker does not host is REPLICA_NOT_AVAILABLE and an unknown one
UNKNOWN_TOPIC_OR_PARTITION.

Authorization (docs/operations.md, "ACLs"), as in Kafka: DescribeLogDirs needs DESCRIBE
on the cluster (else no results and, from v3, top-level CLUSTER_AUTHORIZATION_FAILED);
AlterReplicaLogDirs needs ALTER on the cluster (else every partition answers
CLUSTER_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from kafka.protocol.admin import AlterReplicaLogDirsResponse, DescribeLogDirsResponse

from broker.config import BrokerConfig
from broker.handlers.registry import RequestContext
from broker.meta.base import MetaStoreError
from broker.meta.schema import SegmentMeta, entry_base, segments_prefix
from broker.security.authz import Operation, allowed_cluster
from protocol.errors import ErrorCode

_Result = DescribeLogDirsResponse.DescribeLogDirsResult
_DTopic = _Result.DescribeLogDirsTopic
_DPart = _DTopic.DescribeLogDirsPartition
_ATopic = AlterReplicaLogDirsResponse.AlterReplicaLogDirTopicResult
_APart = _ATopic.AlterReplicaLogDirPartitionResult


def log_dir_name(config: BrokerConfig) -> str:
    """The one log dir: the store URL without credentials or query, plus the namespace."""
    u = urlsplit(config.store_url)
    host = u.hostname or ""
    if u.port:
        host = f"{host}:{u.port}"
    path = u.path.rstrip("/")
    return f"{u.scheme}://{host}{path}/{config.namespace}"


async def _size(ctx: RequestContext, topic: str, partition: int) -> int:
    logs = ctx.broker.logs
    lg = logs.logs.get((topic, partition))
    if lg is not None:
        return sum(s.size for s in lg.segments)
    kvs = await logs.meta.range(segments_prefix(topic, partition))
    return sum(SegmentMeta.from_json(entry_base(kv.key), kv.value).size for kv in kvs)


async def describe_log_dirs(ctx: RequestContext, request: Any) -> Any:
    broker = ctx.broker
    topics = broker.topics
    if not allowed_cluster(ctx, Operation.DESCRIBE):
        code = int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
        return DescribeLogDirsResponse(throttle_time_ms=0, error_code=code, results=[])
    if request.topics is None:
        wanted = [(info.name, list(range(info.partitions))) for info in topics.all()]
    else:
        wanted = []
        for t in request.topics:
            info = topics.get(t.topic)
            if info is not None:
                wanted.append((info.name, [p for p in t.partitions if 0 <= p < info.partitions]))
    name = log_dir_name(broker.config)
    out = []
    try:
        for topic, parts in sorted(wanted, key=lambda w: w[0]):
            entries = [
                _DPart(
                    partition_index=p,
                    partition_size=await _size(ctx, topic, p),
                    offset_lag=0,
                    is_future_key=False,
                )
                for p in parts
                if broker.cluster.owns_partition(topic, p)
            ]
            if entries:
                out.append(_DTopic(name=topic, partitions=entries))
    except MetaStoreError:  # the dir cannot be read now: retriable for the client
        result = _Result(error_code=int(ErrorCode.KAFKA_STORAGE_ERROR), log_dir=name, topics=[])
        return DescribeLogDirsResponse(throttle_time_ms=0, error_code=0, results=[result])
    result = _Result(error_code=0, log_dir=name, topics=out, total_bytes=-1, usable_bytes=-1)
    return DescribeLogDirsResponse(throttle_time_ms=0, error_code=0, results=[result])


def _move(ctx: RequestContext, path: str, topic: str, partition: int, ours: str) -> ErrorCode:
    info = ctx.broker.topics.get(topic)
    if info is None or not 0 <= partition < info.partitions:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if path.rstrip("/") != ours:
        return ErrorCode.LOG_DIR_NOT_FOUND
    if not ctx.broker.cluster.owns_partition(topic, partition):
        return ErrorCode.REPLICA_NOT_AVAILABLE
    return ErrorCode.NONE


async def alter_replica_log_dirs(ctx: RequestContext, request: Any) -> Any:
    ours = log_dir_name(ctx.broker.config)
    denied = not allowed_cluster(ctx, Operation.ALTER)
    results: dict[str, list[Any]] = {}
    for d in request.dirs:
        for t in d.topics:
            parts = results.setdefault(t.name, [])
            for p in t.partitions:
                code = (
                    ErrorCode.CLUSTER_AUTHORIZATION_FAILED
                    if denied
                    else _move(ctx, d.path, t.name, p, ours)
                )
                parts.append(_APart(partition_index=p, error_code=int(code)))
    return AlterReplicaLogDirsResponse(
        throttle_time_ms=0,
        results=[_ATopic(topic_name=n, partitions=ps) for n, ps in results.items()],
    )
