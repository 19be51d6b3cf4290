"""Topic administration: CreateTopics (19) v0-7, DeleteTopics (20) v0-6, CreatePartitions (37)
v0-3.

Every topic in a request gets its own result; an unknown topic, an invalid name, partition
count, replication factor or config is an error code (and, where the version has one, a
message) for that topic, never a failed request. Topics named twice in one request get
INVALID_REQUEST, as in Kafka.

Deviations (see ``broker.topics``): the replication factor is validated (-1 or 1..3) but not
stored, and responses report 1; manual replica assignments only fix the partition count;
``timeout_ms`` is ignored because every change is one metadata transaction that is
complete when the response is sent. CreateTopics v5+ returns the topic's configs (all
whitelisted ones, set or default), v7 its id; DeleteTopics v6 deletes by name or by id.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from typing import Any

from broker.handlers.registry import RequestContext
from broker.meta.base import MetaStoreError
from broker.meta.schema import TopicInfo
from broker.security.authz import Operation, ResourceType, allowed, may_create_topic
from broker.topics import TopicManager
from protocol.codec import response_class
from protocol.errors import ErrorCode, KafkaProtocolError

log = logging.getLogger(__name__)

ZERO_UUID = uuid.UUID(int=0)
# kafka-python's classes, imported quietly by protocol.codec
CreateTopicsResponse: Any = response_class(19)
DeleteTopicsResponse: Any = response_class(20)
CreatePartitionsResponse: Any = response_class(37)
_CreateResult = CreateTopicsResponse.CreatableTopicResult
_CreateConfig = _CreateResult.CreatableTopicConfigs
_DeleteResult = DeleteTopicsResponse.DeletableTopicResult
_PartitionsResult = CreatePartitionsResponse.CreatePartitionsTopicResult


def _error_of(exc: Exception) -> tuple[ErrorCode, str]:
    if isinstance(exc, KafkaProtocolError):
        return exc.code, exc.message or exc.code.name
    log.warning("topic admin request failed: %s", exc)
    return ErrorCode.UNKNOWN_SERVER_ERROR, f"metadata store error: {exc}"


def _duplicates(names: list[str | None]) -> set[str | None]:
    return {n for n, count in Counter(names).items() if count > 1}


# ---------------------------------------------------------------- CreateTopics


def _created(topics: TopicManager, info: TopicInfo) -> Any:
    configs = [
        _CreateConfig(
            name=e.name,
            value=e.value,
            read_only=e.read_only,
            config_source=int(e.source),
            is_sensitive=e.is_sensitive,
        )
        for e in topics.topic_config_entries(info)
    ]
    return _CreateResult(
        name=info.name,
        topic_id=info.topic_id,
        error_code=0,
        error_message=None,
        num_partitions=info.partitions,
        replication_factor=1,
        configs=configs,
    )


def _create_failed(name: str, code: ErrorCode, message: str) -> Any:
    return _CreateResult(
        name=name,
        topic_id=ZERO_UUID,
        error_code=int(code),
        error_message=message,
        num_partitions=-1,
        replication_factor=-1,
        configs=None,
    )


async def _create_one(topics: TopicManager, topic: Any, validate_only: bool) -> Any:
    configs: dict[str, str | None] = {}
    for c in topic.configs or ():
        if c.name in configs:
            return _create_failed(
                topic.name, ErrorCode.INVALID_REQUEST, f"config {c.name!r} given twice"
            )
        configs[c.name] = c.value
    assignments = {a.partition_index: list(a.broker_ids) for a in topic.assignments or ()}
    try:
        info = await topics.create(
            topic.name,
            topic.num_partitions,
            configs,
            validate_only,
            replication_factor=topic.replication_factor,
            assignments=assignments or None,
        )
    except (KafkaProtocolError, MetaStoreError) as exc:
        return _create_failed(topic.name, *_error_of(exc))
    return _created(topics, info)


async def create_topics(ctx: RequestContext, request: Any) -> Any:
    topics: TopicManager = ctx.broker.topics
    validate_only = bool(getattr(request, "validate_only", False))
    dups = _duplicates([t.name for t in request.topics])
    results = []
    for topic in request.topics:
        if topic.name in dups:
            msg = f"topic {topic.name!r} appears more than once in the request"
            results.append(_create_failed(topic.name, ErrorCode.INVALID_REQUEST, msg))
        elif not may_create_topic(ctx, topic.name):
            code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            results.append(_create_failed(topic.name, code, "not authorized to create it"))
        else:
            results.append(await _create_one(topics, topic, validate_only))
    return CreateTopicsResponse(version=ctx.header.api_version, throttle_time_ms=0, topics=results)


# ---------------------------------------------------------------- DeleteTopics


def _deleted(
    name: str | None,
    topic_id: uuid.UUID,
    code: ErrorCode = ErrorCode.NONE,
    message: str | None = None,
) -> Any:
    return _DeleteResult(name=name, topic_id=topic_id, error_code=int(code), error_message=message)


async def _delete_one(topics: TopicManager, name: str | None, topic_id: uuid.UUID) -> Any:
    if topic_id != ZERO_UUID:
        if name is not None:
            return _deleted(name, topic_id, ErrorCode.INVALID_REQUEST, "give a name or an id")
        info = topics.get_by_id(topic_id)
        if info is None:
            return _deleted(None, topic_id, ErrorCode.UNKNOWN_TOPIC_ID, "unknown topic id")
        name = info.name
    if name is None:
        return _deleted(None, topic_id, ErrorCode.INVALID_REQUEST, "no topic name or id")
    try:
        old = await topics.delete(name)
    except (KafkaProtocolError, MetaStoreError) as exc:
        return _deleted(name, topic_id, *_error_of(exc))
    return _deleted(name, old.topic_id)


def _may_delete(ctx: RequestContext, name: str | None, topic_id: uuid.UUID) -> bool:
    if name is None and topic_id != ZERO_UUID:
        info = ctx.broker.topics.get_by_id(topic_id)
        name = info.name if info is not None else None
    return name is None or allowed(ctx, Operation.DELETE, ResourceType.TOPIC, name)


async def delete_topics(ctx: RequestContext, request: Any) -> Any:
    topics: TopicManager = ctx.broker.topics
    version = ctx.header.api_version
    if version >= 6:
        wanted = [(t.name, t.topic_id or ZERO_UUID) for t in request.topics or ()]
    else:
        wanted = [(n, ZERO_UUID) for n in request.topic_names or ()]
    dups = _duplicates([n if tid == ZERO_UUID else str(tid) for n, tid in wanted])
    results = []
    for name, topic_id in wanted:
        if (name if topic_id == ZERO_UUID else str(topic_id)) in dups:
            msg = "topic appears more than once in the request"
            results.append(_deleted(name, topic_id, ErrorCode.INVALID_REQUEST, msg))
        elif not _may_delete(ctx, name, topic_id):
            code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            results.append(_deleted(name, topic_id, code, "not authorized to delete it"))
        else:
            results.append(await _delete_one(topics, name, topic_id))
    return DeleteTopicsResponse(version=version, throttle_time_ms=0, responses=results)


# ---------------------------------------------------------------- CreatePartitions


async def create_partitions(ctx: RequestContext, request: Any) -> Any:
    topics: TopicManager = ctx.broker.topics
    dups = _duplicates([t.name for t in request.topics])
    results = []
    for topic in request.topics:
        code, message = ErrorCode.NONE, None
        if topic.name in dups:
            code, message = ErrorCode.INVALID_REQUEST, "topic appears more than once"
        elif not allowed(ctx, Operation.ALTER, ResourceType.TOPIC, topic.name):
            code, message = ErrorCode.TOPIC_AUTHORIZATION_FAILED, None
        else:
            assignments = [list(a.broker_ids) for a in topic.assignments or ()]
            try:
                await topics.add_partitions(
                    topic.name, topic.count, bool(request.validate_only), assignments or None
                )
            except (KafkaProtocolError, MetaStoreError) as exc:
                code, message = _error_of(exc)
        results.append(
            _PartitionsResult(name=topic.name, error_code=int(code), error_message=message)
        )
    return CreatePartitionsResponse(
        version=ctx.header.api_version, throttle_time_ms=0, results=results
    )
