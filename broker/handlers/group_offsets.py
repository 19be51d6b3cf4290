"""Committed-offset APIs, on ``groupcoord.GroupCoordinator``.

Supported versions:

- OffsetCommit (8) v0-9: one metadata-store transaction per request (docs/format.md,
metadata keys). v0 and
  generation -1 commit as a standalone ("simple") consumer, allowed only while the group
  has no members. ``retention_time_ms`` (v2-4) and ``commit_timestamp`` (v1) are ignored:
  retention is the broker's ``offsets_retention_minutes`` and the commit time is the
  broker's clock. Partitions of unknown topics get UNKNOWN_TOPIC_OR_PARTITION; metadata
  longer than 4096 characters gets OFFSET_METADATA_TOO_LARGE.
- OffsetFetch (9) v0-9: v8 fetches several groups in one request; a null topic list (v2+)
  means every committed offset of the group. ``require_stable`` (v7+) needs no waiting:
  there are no transactional offsets. A partition without a commit answers offset -1.
- OffsetCommit v9 / OffsetFetch v9 (KIP-848): for a consumer group the member id and
  member epoch are checked: UNKNOWN_MEMBER_ID for a member not in the group,
  STALE_MEMBER_EPOCH for another epoch; epoch -1 without a member id (admin tools,
  standalone consumers) only while the group has no members. v10 (topic ids) is not
  served.
- OffsetDelete (47) v0: offsets of topics the group's members are subscribed to get
  GROUP_SUBSCRIBED_TO_TOPIC; a non-empty group of another protocol type NON_EMPTY_GROUP.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import (
    OffsetCommitResponse,
    OffsetDeleteResponse,
    OffsetFetchResponse,
)

from broker.handlers.groups import coordinator, group_error, guarded
from broker.handlers.registry import RequestContext
from broker.security.authz import Operation, ResourceType, allowed
from groupcoord import OffsetCommit, OffsetRecord, TopicPartition
from protocol.errors import ErrorCode

_CommitTopic = OffsetCommitResponse.OffsetCommitResponseTopic
_CommitPartition = _CommitTopic.OffsetCommitResponsePartition
_FetchTopic = OffsetFetchResponse.OffsetFetchResponseTopic
_FetchPartition = _FetchTopic.OffsetFetchResponsePartition
_FetchGroup = OffsetFetchResponse.OffsetFetchResponseGroup
_FetchGroupTopic = _FetchGroup.OffsetFetchResponseTopics
_FetchGroupPartition = _FetchGroupTopic.OffsetFetchResponsePartitions
_DeleteTopic = OffsetDeleteResponse.OffsetDeleteResponseTopic
_DeletePartition = _DeleteTopic.OffsetDeleteResponsePartition


def _known(ctx: RequestContext, tp: TopicPartition) -> bool:
    info = ctx.broker.topics.get(tp.topic)
    return info is not None and 0 <= tp.partition < info.partitions


def _by_topic(errors: dict[TopicPartition, ErrorCode]) -> dict[str, list[tuple[int, ErrorCode]]]:
    out: dict[str, list[tuple[int, ErrorCode]]] = {}
    for tp, err in errors.items():
        out.setdefault(tp.topic, []).append((tp.partition, err))
    return out


# ---- OffsetCommit ----


def _commit_error(ctx: RequestContext, request: Any, err: ErrorCode) -> Any:
    topics = [
        _CommitTopic(
            name=t.name,
            partitions=[
                _CommitPartition(partition_index=p.partition_index, error_code=int(err))
                for p in t.partitions or []
            ],
        )
        for t in request.topics or []
    ]
    return OffsetCommitResponse(throttle_time_ms=0, topics=topics)


def _fetch_error(ctx: RequestContext, request: Any, err: ErrorCode) -> Any:
    if ctx.header.api_version >= 8:
        groups = [
            _FetchGroup(group_id=g.group_id, topics=[], error_code=int(err))
            for g in request.groups or []
        ]
        return OffsetFetchResponse(throttle_time_ms=0, groups=groups)
    topics = [
        _FetchTopic(
            name=t.name,
            partitions=[
                _FetchPartition(
                    partition_index=p,
                    committed_offset=-1,
                    committed_leader_epoch=-1,
                    metadata="",
                    error_code=int(err),
                )
                for p in t.partition_indexes or []
            ],
        )
        for t in request.topics or []
    ]
    return OffsetFetchResponse(throttle_time_ms=0, topics=topics, error_code=int(err))


@guarded(_commit_error)
async def offset_commit(ctx: RequestContext, request: Any) -> Any:
    version = ctx.header.api_version
    group_id = request.group_id
    errors: dict[TopicPartition, ErrorCode] = {}
    commits: list[OffsetCommit] = []
    for topic in request.topics or []:
        for p in topic.partitions or []:
            tp = TopicPartition(topic.name, p.partition_index)
            if not allowed(ctx, Operation.READ, ResourceType.TOPIC, topic.name):
                errors[tp] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                continue
            if not _known(ctx, tp):
                errors[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            epoch = getattr(p, "committed_leader_epoch", -1) if version >= 6 else -1
            commits.append(OffsetCommit(tp, p.committed_offset, epoch, p.committed_metadata))
            errors[tp] = ErrorCode.NONE
    err = group_error(ctx, group_id)
    if err is not None:
        errors = dict.fromkeys(errors, err)
    elif commits:
        errors.update(
            await coordinator(ctx).commit_offsets(
                group_id,
                request.generation_id_or_member_epoch if version >= 1 else -1,
                (request.member_id or "") if version >= 1 else "",
                getattr(request, "group_instance_id", None) if version >= 7 else None,
                commits,
            )
        )
    topics = [
        _CommitTopic(
            name=name,
            partitions=[_CommitPartition(partition_index=p, error_code=int(e)) for p, e in parts],
        )
        for name, parts in _by_topic(errors).items()
    ]
    return OffsetCommitResponse(throttle_time_ms=0, topics=topics)


# ---- OffsetFetch ----


async def _fetch_group(
    ctx: RequestContext, group_id: str, topics: Any, member: tuple[str | None, int] | None = None
) -> tuple[ErrorCode, list[tuple[str, list[tuple[int, OffsetRecord | None, ErrorCode]]]]]:
    """(group error, [(topic, [(partition, committed or None, error)])]); ``member``:
    v9's (member id, member epoch), checked against a KIP-848 consumer group."""
    wanted: list[TopicPartition] | None = None
    if topics is not None:
        wanted = [TopicPartition(t.name, p) for t in topics for p in t.partition_indexes or []]
    err = group_error(ctx, group_id, Operation.DESCRIBE)
    offsets: dict[TopicPartition, OffsetRecord] = {}
    consumer = coordinator(ctx).consumer if err is None else None
    if consumer is not None and member is not None and (member[0] or member[1] >= 0):
        refused = await consumer.offset_member_error(group_id, member[0] or "", member[1])
        if refused is not None:
            err = refused[0]
    if err is None:
        err, offsets = await coordinator(ctx).fetch_offsets(group_id, wanted)
    rows: dict[str, list[tuple[int, OffsetRecord | None, ErrorCode]]] = {}
    for tp in wanted if wanted is not None else sorted(offsets, key=_tp_key):
        pe = err if err is not ErrorCode.NONE else ErrorCode.NONE
        rec = offsets.get(tp)
        if not allowed(ctx, Operation.DESCRIBE, ResourceType.TOPIC, tp.topic):
            if wanted is None:
                continue  # all offsets: topics the principal may not see are left out
            pe, rec = ErrorCode.TOPIC_AUTHORIZATION_FAILED, None
        rows.setdefault(tp.topic, []).append((tp.partition, rec, pe))
    return err, list(rows.items())


def _tp_key(tp: TopicPartition) -> tuple[str, int]:
    return tp.topic, tp.partition


def _meta(rec: OffsetRecord | None) -> str:
    return (rec.metadata or "") if rec is not None else ""


@guarded(_fetch_error)
async def offset_fetch(ctx: RequestContext, request: Any) -> Any:
    version = ctx.header.api_version
    if version >= 8:
        groups = []
        for g in request.groups or []:
            member = (g.member_id, g.member_epoch) if version >= 9 else None
            err, rows = await _fetch_group(ctx, g.group_id, g.topics, member)
            topics = [
                _FetchGroupTopic(
                    name=name,
                    partitions=[
                        _FetchGroupPartition(
                            partition_index=p,
                            committed_offset=rec.offset if rec else -1,
                            committed_leader_epoch=rec.leader_epoch if rec else -1,
                            metadata=_meta(rec),
                            error_code=int(e),
                        )
                        for p, rec, e in parts
                    ],
                )
                for name, parts in rows
            ]
            groups.append(_FetchGroup(group_id=g.group_id, topics=topics, error_code=int(err)))
        return OffsetFetchResponse(throttle_time_ms=0, groups=groups)
    err, rows = await _fetch_group(ctx, request.group_id, request.topics)
    topics = [
        _FetchTopic(
            name=name,
            partitions=[
                _FetchPartition(
                    partition_index=p,
                    committed_offset=rec.offset if rec else -1,
                    committed_leader_epoch=rec.leader_epoch if rec else -1,
                    metadata=_meta(rec),
                    error_code=int(e),
                )
                for p, rec, e in parts
            ],
        )
        for name, parts in rows
    ]
    return OffsetFetchResponse(throttle_time_ms=0, topics=topics, error_code=int(err))


# ---- OffsetDelete ----


@guarded(lambda ctx, r, e: OffsetDeleteResponse(error_code=int(e), throttle_time_ms=0, topics=[]))
async def offset_delete(ctx: RequestContext, request: Any) -> Any:
    group_id = request.group_id
    errors: dict[TopicPartition, ErrorCode] = {}
    wanted: list[TopicPartition] = []
    for topic in request.topics or []:
        for p in topic.partitions or []:
            tp = TopicPartition(topic.name, p.partition_index)
            if not allowed(ctx, Operation.READ, ResourceType.TOPIC, topic.name):
                errors[tp] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif _known(ctx, tp):
                wanted.append(tp)
            else:
                errors[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    top = group_error(ctx, group_id, Operation.DELETE)
    if top is None:
        result = await coordinator(ctx).delete_offsets(group_id, wanted)
        top = result.error
        errors.update(result.partitions)
    if top is not ErrorCode.NONE:
        return OffsetDeleteResponse(error_code=int(top), throttle_time_ms=0, topics=[])
    topics = [
        _DeleteTopic(
            name=name,
            partitions=[_DeletePartition(partition_index=p, error_code=int(e)) for p, e in parts],
        )
        for name, parts in _by_topic(errors).items()
    ]
    return OffsetDeleteResponse(error_code=0, throttle_time_ms=0, topics=topics)
