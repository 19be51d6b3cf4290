"""Leadership and replica admin: ElectLeaders (43) v0-2, ListPartitionReassignments (46)
v0, AlterPartitionReassignments (45) v0-1.

A partition's leader is its owner: the broker rendezvous hashing names among the live
brokers, which takes the partition (an owner key in the metadata store) on first use
(docs/architecture.md, ownership). ElectLeaders, preferred or unclean alike:

- a partition held by the broker that should own it answers ELECTION_NOT_NEEDED;
- one nobody holds (or held by a broker that should hand it off) is taken now: by this
  broker when it is the owner, else the request is forwarded over the Kafka protocol to
  the owner, which takes it and answers (a forwarded request is never forwarded again:
  if membership moved meanwhile it answers PREFERRED_LEADER_NOT_AVAILABLE, retriable);
- unknown partitions answer UNKNOWN_TOPIC_OR_PARTITION. A null list means every partition.

There are no replicas: ListPartitionReassignments answers an empty list (no reassignment
is ever in progress), and AlterPartitionReassignments refuses each partition, saying why:
INVALID_REPLICA_ASSIGNMENT for a new replica list (there is nothing to move: the data
lives in the object store and ownership follows broker membership),
NO_REASSIGNMENT_IN_PROGRESS for a cancellation (null replicas).

Authorization (docs/operations.md, "ACLs"), as Kafka's controller does it: ElectLeaders
and AlterPartitionReassignments need ALTER on the cluster, ListPartitionReassignments
DESCRIBE; denied, the answer is a top-level CLUSTER_AUTHORIZATION_FAILED (and the same
for each requested partition). A forwarded ElectLeaders is authorized again by the owner,
as the principal the forwarding broker logs in as (``--inter-broker-*``, see
docs/operations.md "Inter-broker requests").
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from kafka.protocol.admin import (
    AlterPartitionReassignmentsResponse,
    ElectLeadersRequest,
    ElectLeadersResponse,
    ListPartitionReassignmentsResponse,
)

from broker.handlers.registry import RequestContext
from broker.partition import ACTIVE
from broker.peer import PeerError, call_peer
from broker.security.authz import Operation, allowed_cluster
from broker.security.inter_broker import InterBrokerError, client_tls, peer_target
from protocol.errors import ErrorCode, KafkaProtocolError

log = logging.getLogger(__name__)

FORWARDED = "kafscale-elect-leaders-forward"  # client id of a forwarded ElectLeaders
FORWARD_TIMEOUT_S = 30.0
_Result = ElectLeadersResponse.ReplicaElectionResult
_PartResult = _Result.PartitionResult
_ReqTopic = ElectLeadersRequest.TopicPartitions
_NO_REPLICAS = (
    "there are no replicas to move: partition data lives in the object store and its "
    "owner follows broker membership"
)

Outcome = tuple[int, str | None]


def _wanted(ctx: RequestContext, request: Any) -> list[tuple[str, int]]:
    if request.topic_partitions is None:
        return [(i.name, p) for i in ctx.broker.topics.all() for p in range(i.partitions)]
    return [(t.topic, p) for t in request.topic_partitions for p in t.partitions]


async def _take(ctx: RequestContext, topic: str, partition: int) -> Outcome:
    try:
        await ctx.broker.logs.get(topic, partition)
    except KafkaProtocolError as exc:
        return int(exc.code), exc.message or None
    return 0, None


async def _forward(
    ctx: RequestContext, node: int, tps: list[tuple[str, int]], request: Any
) -> dict[tuple[str, int], Outcome]:
    peer = ctx.broker.cluster.broker(node)
    failed: Outcome = (int(ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE), f"broker {node} is gone")
    if peer is None:
        return dict.fromkeys(tps, failed)
    by_topic: dict[str, list[int]] = defaultdict(list)
    for t, p in tps:
        by_topic[t].append(p)
    fwd = ElectLeadersRequest(
        election_type=getattr(request, "election_type", 0),
        topic_partitions=[_ReqTopic(topic=t, partitions=ps) for t, ps in by_topic.items()],
        timeout_ms=request.timeout_ms,
    )
    try:
        target = peer_target(ctx.broker.config.security, peer)
        tls = None
        if target.protocol in ("SSL", "SASL_SSL"):
            tls = await asyncio.to_thread(client_tls, ctx.broker.config.security)
        resp = await call_peer(target.host, target.port, fwd, 2, FORWARDED, FORWARD_TIMEOUT_S,
                               tls=tls, login=target.login)  # fmt: skip
    except (PeerError, InterBrokerError, OSError, ssl.SSLError) as exc:
        log.warning("forwarding ElectLeaders to broker %d failed: %s", node, exc)
        return dict.fromkeys(tps, (failed[0], f"broker {node} unreachable: {exc}"))
    out = dict.fromkeys(tps, failed)
    for r in resp.replica_election_results:
        for pr in r.partition_result:
            out[(r.topic, pr.partition_id)] = (pr.error_code, pr.error_message)
    return out


def _elect_denied(request: Any) -> Any:
    code = int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    asked = [(t.topic, p) for t in request.topic_partitions or [] for p in t.partitions]
    results = _results((tp, (code, None)) for tp in asked)
    return ElectLeadersResponse(
        throttle_time_ms=0, error_code=code, replica_election_results=results
    )


async def elect_leaders(ctx: RequestContext, request: Any) -> Any:
    if not allowed_cluster(ctx, Operation.ALTER):
        return _elect_denied(request)
    broker = ctx.broker
    cluster = broker.cluster
    forwarded = ctx.header.client_id == FORWARDED
    outcome: dict[tuple[str, int], Outcome] = {}
    remote: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for topic, p in _wanted(ctx, request):
        info = broker.topics.get(topic)
        if info is None or not 0 <= p < info.partitions:
            outcome[(topic, p)] = (int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), None)
            continue
        owner = cluster.partition_owner(topic, p).node_id
        mine = broker.logs.logs.get((topic, p))  # held here (the watch may lag behind)
        if cluster.holder(topic, p) == owner or (
            owner == cluster.me.node_id and mine is not None and mine.state == ACTIVE
        ):
            outcome[(topic, p)] = (int(ErrorCode.ELECTION_NOT_NEEDED), "already led by its owner")
        elif owner == cluster.me.node_id:
            outcome[(topic, p)] = await _take(ctx, topic, p)
        elif forwarded:
            msg = f"broker {owner} owns it now"
            outcome[(topic, p)] = (int(ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE), msg)
        else:
            remote[owner].append((topic, p))
    for node, tps in remote.items():
        outcome.update(await _forward(ctx, node, tps, request))
    return ElectLeadersResponse(
        throttle_time_ms=0, error_code=0, replica_election_results=_results(outcome.items())
    )


def _results(items: Iterable[tuple[tuple[str, int], Outcome]]) -> list[Any]:
    by_topic: dict[str, list[Any]] = defaultdict(list)
    for (topic, p), (code, msg) in items:
        by_topic[topic].append(_PartResult(partition_id=p, error_code=code, error_message=msg))
    return [_Result(topic=t, partition_result=ps) for t, ps in by_topic.items()]


async def list_partition_reassignments(ctx: RequestContext, request: Any) -> Any:
    code = 0 if allowed_cluster(ctx, Operation.DESCRIBE) else ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    return ListPartitionReassignmentsResponse(
        throttle_time_ms=0, error_code=int(code), error_message=None, topics=[]
    )


_RTopic = AlterPartitionReassignmentsResponse.ReassignableTopicResponse
_RPart = _RTopic.ReassignablePartitionResponse


async def alter_partition_reassignments(ctx: RequestContext, request: Any) -> Any:
    denied = not allowed_cluster(ctx, Operation.ALTER)
    topics = []
    for t in request.topics:
        info = ctx.broker.topics.get(t.name)
        parts = []
        for p in t.partitions:
            if denied:
                code, msg = ErrorCode.CLUSTER_AUTHORIZATION_FAILED, None
            elif info is None or not 0 <= p.partition_index < info.partitions:
                code, msg = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None
            elif p.replicas is None:
                code, msg = ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, "no reassignment is ever made"
            else:
                code, msg = ErrorCode.INVALID_REPLICA_ASSIGNMENT, _NO_REPLICAS
            parts.append(
                _RPart(partition_index=p.partition_index, error_code=int(code), error_message=msg)
            )
        topics.append(_RTopic(name=t.name, partitions=parts))
    return AlterPartitionReassignmentsResponse(
        throttle_time_ms=0,
        allow_replication_factor_change=getattr(request, "allow_replication_factor_change", True),
        error_code=int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED) if denied else 0,
        error_message=None,
        responses=topics,
    )
