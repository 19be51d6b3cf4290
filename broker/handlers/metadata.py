"""Metadata (key 3), versions 0-13 (v13's top-level error code is always 0).

Leaders are the partitions' owners by rendezvous hashing over the live brokers
(docs/architecture.md, ownership), so every broker gives the same answer; the leader
epoch is the owner key's epoch
(-1 before anyone has taken the partition). Replicas and ISR are the leader alone: the
data's durability is the object store's. Topics are auto-created when the request allows
it (v4+ flag; always for v0-3) and the broker's auto-create setting is on. v10+ carries
topic ids; v12 accepts topics requested by id. Authorized operations (KIP-430) are
computed when requested (topics v8+, the cluster v8-10). Topics the principal may not
DESCRIBE are left out of all-topic answers and named ones get TOPIC_AUTHORIZATION_FAILED
(docs/operations.md, "Security").
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from kafka.protocol.metadata import MetadataResponse

from broker.handlers.registry import RequestContext
from broker.meta.base import MetaStoreError
from broker.meta.schema import TopicInfo
from broker.security.authz import (
    CLUSTER_NAME,
    Operation,
    ResourceType,
    allowed,
    authorized_operations,
    listener_name,
    may_create_topic,
)
from broker.topic_validation import is_valid_topic_name
from protocol.errors import ErrorCode

_Broker = MetadataResponse.MetadataResponseBroker
_Topic = MetadataResponse.MetadataResponseTopic
_Partition = _Topic.MetadataResponsePartition
_ZERO_UUID = uuid.UUID(int=0)

log = logging.getLogger(__name__)


def _topic_entry(ctx: RequestContext, info: TopicInfo) -> Any:
    cluster = ctx.broker.cluster
    parts = []
    for p in range(info.partitions):
        leader = cluster.partition_owner(info.name, p).node_id
        parts.append(
            _Partition(
                error_code=0,
                partition_index=p,
                leader_id=leader,
                leader_epoch=cluster.leader_epoch(info.name, p),
                replica_nodes=[leader],
                isr_nodes=[leader],
                offline_replicas=[],
            )
        )
    return _Topic(
        error_code=0, name=info.name, topic_id=info.topic_id, is_internal=False, partitions=parts
    )


def _error_entry(code: ErrorCode, name: str | None, topic_id: uuid.UUID | None) -> Any:
    return _Topic(error_code=int(code), name=name, topic_id=topic_id or _ZERO_UUID, partitions=[])


def _visible(ctx: RequestContext, name: str) -> bool:
    return allowed(ctx, Operation.DESCRIBE, ResourceType.TOPIC, name)


async def _lookup(ctx: RequestContext, req_topic: Any, auto: bool) -> Any:
    topics = ctx.broker.topics
    name = getattr(req_topic, "name", None)
    topic_id = getattr(req_topic, "topic_id", None)
    if name is None:
        if topic_id is None or topic_id == _ZERO_UUID:
            return _error_entry(ErrorCode.INVALID_REQUEST, None, None)
        info = topics.get_by_id(topic_id)
        if info is None or not _visible(ctx, info.name):
            return _error_entry(ErrorCode.UNKNOWN_TOPIC_ID, None, topic_id)
        return _topic_entry(ctx, info)
    if not _visible(ctx, name):
        return _error_entry(ErrorCode.TOPIC_AUTHORIZATION_FAILED, name, None)
    info = topics.get(name)
    if info is None and auto and may_create_topic(ctx, name):
        try:
            info = await topics.ensure(name)
        except MetaStoreError as exc:  # retriable: the client asks again
            log.warning("auto-creating topic %s failed: %s", name, exc)
            return _error_entry(ErrorCode.LEADER_NOT_AVAILABLE, name, None)
        if info is None:
            code = (
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                if is_valid_topic_name(name)
                else ErrorCode.INVALID_TOPIC_EXCEPTION
            )
            return _error_entry(code, name, None)
    if info is None:
        return _error_entry(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name, None)
    return _topic_entry(ctx, info)


async def metadata(ctx: RequestContext, request: Any) -> Any:
    version = ctx.header.api_version
    broker = ctx.broker
    requested = request.topics
    if version == 0 and not requested:
        requested = None  # v0: an empty list means every topic
    auto = broker.config.auto_create_topics and (
        version < 4 or bool(getattr(request, "allow_auto_topic_creation", True))
    )
    if requested is None:
        topics = [
            _topic_entry(ctx, info)
            for info in sorted(broker.topics.all(), key=_name)
            if _visible(ctx, info.name)
        ]
    else:
        topics = [await _lookup(ctx, t, auto) for t in requested]
    listener = listener_name(ctx)
    brokers = [
        _Broker(node_id=b.node_id, host=h, port=p, rack=b.rack)
        for b in broker.cluster.brokers()
        for h, p in (b.address(listener),)
    ]
    if getattr(request, "include_topic_authorized_operations", False):  # KIP-430
        for t in topics:
            if t.error_code == 0 and t.name:
                t.authorized_operations = authorized_operations(ctx, ResourceType.TOPIC, t.name)
    cluster_ops = None
    if getattr(request, "include_cluster_authorized_operations", False) and version <= 10:
        cluster_ops = authorized_operations(ctx, ResourceType.CLUSTER, CLUSTER_NAME)
    return MetadataResponse(
        throttle_time_ms=0,
        brokers=brokers,
        cluster_id=broker.cluster_id,
        controller_id=broker.cluster.controller_id(),
        topics=topics,
        authorized_operations=cluster_ops,
    )


def _name(info: TopicInfo) -> str:
    return info.name
