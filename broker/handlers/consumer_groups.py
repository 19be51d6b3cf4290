"""KIP-848 consumer-group APIs, on ``groupcoord.consumer_coordinator``.

Supported versions:

- ConsumerGroupHeartbeat (68) v0-1: v1 carries ``SubscribedTopicRegex`` (Python ``re``
  full match on topic names; lookaround and backreferences, which RE2J lacks, get
  INVALID_REGULAR_EXPRESSION). A member joining with an empty member id gets one from the
  coordinator; a client-generated id (Kafka 4 clients) is kept. Server assignors
  ``uniform`` (default) and ``range``; others get UNSUPPORTED_ASSIGNOR. Owned partitions
  of topics the broker does not know (deleted ones) match no target and are
  ignored. Racks are recorded but not used for placement. Heartbeats that arrive while
  the group is being written share the next write (groupcoord/consumer_coordinator.py).
- ConsumerGroupDescribe (69) v0-1: v1's member type is always 1 (consumer): classic
  members never join a consumer group here.

Authorization (docs/operations.md, "ACLs"), as in Kafka 4: a heartbeat needs READ on the
group (else GROUP_AUTHORIZATION_FAILED) and DESCRIBE on every topic of
``SubscribedTopicNames`` (else TOPIC_AUTHORIZATION_FAILED); a regex matches only the
topics the member's principal (from its host) may DESCRIBE, re-evaluated on every
heartbeat, so an ACL change moves the group's assignment at the next one.
ConsumerGroupDescribe needs DESCRIBE on each group (else that group answers
GROUP_AUTHORIZATION_FAILED), answers KIP-430 authorized operations when asked, and a
group whose members' assignments name a topic the principal may not DESCRIBE answers
TOPIC_AUTHORIZATION_FAILED without its members.

A group this broker does not own gets NOT_COORDINATOR. docs/compatibility.md, KIP-848
consumer groups.
"""

from __future__ import annotations

import logging
import struct
import uuid
from typing import Any

from kafka.protocol.admin import DescribeGroupsResponse

from broker.handlers.groups import client_host, group_error, guarded
from broker.handlers.registry import RequestContext
from broker.security.authz import (
    Operation,
    ResourceType,
    allowed,
    authorized_operations,
    authorizer_of,
    principal,
)
from groupcoord.consumer_coordinator import ConsumerGroupCoordinator
from groupcoord.consumer_group import HeartbeatRequest, HeartbeatResult
from groupcoord.consumer_model import Assignment, ConsumerGroupState
from protocol.consumer_groups import (
    ConsumerGroupDescribeResponse,
    ConsumerGroupHeartbeatResponse,
    DescribedAssignment,
    DescribedGroup,
    DescribedMember,
    DescribedTopicPartitions,
    HeartbeatAssignment,
    HeartbeatTopicPartitions,
)
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)
_NOT_REQUESTED = -(2**31)


def _consumer(ctx: RequestContext) -> ConsumerGroupCoordinator | None:
    groups = ctx.broker.groups
    return None if groups is None else groups.consumer


def _heartbeat_response(res: HeartbeatResult, interval_ms: int) -> Any:
    assignment = None
    if res.assignment is not None:
        assignment = HeartbeatAssignment(
            topic_partitions=[
                HeartbeatTopicPartitions(topic_id=tid, partitions=sorted(ps))
                for tid, ps in sorted(res.assignment.items(), key=lambda kv: str(kv[0]))
            ]
        )
    ok = res.error is ErrorCode.NONE
    return ConsumerGroupHeartbeatResponse(
        throttle_time_ms=0,
        error_code=int(res.error),
        error_message=res.message,
        member_id=res.member_id if ok else None,
        member_epoch=res.epoch if ok else -1,
        heartbeat_interval_ms=interval_ms if ok else 0,
        assignment=assignment,
    )


def _owned(request: Any) -> Assignment | None:
    parts = request.topic_partitions
    if parts is None:
        return None
    return {
        uuid.UUID(str(t.topic_id)): frozenset(int(p) for p in t.partitions or []) for t in parts
    }


@guarded(lambda ctx, r, e: _heartbeat_response(HeartbeatResult(e, "coordinator unavailable"), 0))
async def consumer_group_heartbeat(ctx: RequestContext, request: Any) -> Any:
    consumer = _consumer(ctx)
    err = group_error(ctx, request.group_id) if request.group_id else None
    if err is None and consumer is None:
        err = ErrorCode.COORDINATOR_NOT_AVAILABLE
    if err is not None:
        return _heartbeat_response(HeartbeatResult(err), 0)
    assert consumer is not None
    version = ctx.header.api_version
    names = request.subscribed_topic_names
    if names and not all(allowed(ctx, Operation.DESCRIBE, ResourceType.TOPIC, n) for n in names):
        return _heartbeat_response(HeartbeatResult(ErrorCode.TOPIC_AUTHORIZATION_FAILED), 0)
    req = HeartbeatRequest(
        group_id=request.group_id,
        member_id=request.member_id or "",
        epoch=request.member_epoch,
        instance_id=request.instance_id,
        rack_id=request.rack_id,
        rebalance_timeout_ms=request.rebalance_timeout_ms,
        topics=None if names is None else tuple(names),
        regex=getattr(request, "subscribed_topic_regex", None) if version >= 1 else None,
        assignor=request.server_assignor,
        owned=_owned(request),
        client_id=ctx.header.client_id or "",
        client_host=client_host(ctx),
        principal=principal(ctx),
    )
    res = await consumer.heartbeat(req)
    if res.error is not ErrorCode.NONE and res.error is not ErrorCode.NOT_COORDINATOR:
        log.debug("group %s heartbeat refused: %s", request.group_id, res.message)
    return _heartbeat_response(res, consumer.config.heartbeat_interval_ms)


def _described_assignment(ctx: RequestContext, a: Assignment) -> Any:
    parts = []
    for tid, ps in sorted(a.items(), key=lambda kv: str(kv[0])):
        info = ctx.broker.topics.get_by_id(tid)
        parts.append(
            DescribedTopicPartitions(
                topic_id=tid, topic_name=info.name if info else "", partitions=sorted(ps)
            )
        )
    return DescribedAssignment(topic_partitions=parts)


def _failed_group(group_id: str, err: ErrorCode, message: str | None = None) -> Any:
    return DescribedGroup(
        error_code=int(err),
        error_message=message,
        group_id=group_id,
        group_state="",
        group_epoch=-1,
        assignment_epoch=-1,
        assignor_name="",
        members=[],
        authorized_operations=_NOT_REQUESTED,
    )


def _described_members(ctx: RequestContext, state: ConsumerGroupState) -> list[Any]:
    return [
        DescribedMember(
            member_id=m.member_id,
            instance_id=m.instance_id,
            rack_id=m.rack_id,
            member_epoch=m.epoch,
            client_id=m.client_id,
            client_host=m.client_host,
            subscribed_topic_names=list(m.topics),
            subscribed_topic_regex=m.regex,
            assignment=_described_assignment(ctx, m.assigned),
            target_assignment=_described_assignment(ctx, state.target.get(m.member_id, {})),
            member_type=1,
        )
        for m in state.members.values()
    ]


async def _describe_one(ctx: RequestContext, group_id: str, include_ops: bool) -> Any:
    if not allowed(ctx, Operation.DESCRIBE, ResourceType.GROUP, group_id):
        return _failed_group(group_id, ErrorCode.GROUP_AUTHORIZATION_FAILED)
    if not group_id:
        return _failed_group(group_id, ErrorCode.INVALID_GROUP_ID, "GroupId can't be empty.")
    consumer = _consumer(ctx)
    err = group_error(ctx, group_id, Operation.DESCRIBE)
    if err is None and consumer is None:
        err = ErrorCode.COORDINATOR_NOT_AVAILABLE
    if err is not None:
        return _failed_group(group_id, err)
    assert consumer is not None
    group = await consumer.load(group_id)
    if group is None:
        msg = f"Group {group_id} is not a consumer group."
        return _failed_group(group_id, ErrorCode.GROUP_ID_NOT_FOUND, msg)
    state = group.state
    members = _described_members(ctx, state)
    if authorizer_of(ctx) is not None and not all(
        allowed(ctx, Operation.DESCRIBE, ResourceType.TOPIC, tp.topic_name)
        for m in members
        for a in (m.assignment, m.target_assignment)
        for tp in a.topic_partitions
        if tp.topic_name  # a deleted topic has no name to authorize
    ):
        msg = "The group has described topic(s) that the client is not authorized to describe."
        return _failed_group(group_id, ErrorCode.TOPIC_AUTHORIZATION_FAILED, msg)
    ops = _NOT_REQUESTED
    if include_ops:
        ops = sum(1 << op for op in authorized_operations(ctx, ResourceType.GROUP, group_id))
    return DescribedGroup(
        error_code=0,
        error_message=None,
        group_id=group_id,
        group_state=state.state_name(),
        group_epoch=state.epoch,
        assignment_epoch=state.assignment_epoch,
        assignor_name=state.assignor or consumer.config.assignors[0],
        members=members,
        authorized_operations=ops,
    )


def _describe_error(ctx: RequestContext, request: Any, err: ErrorCode) -> Any:
    groups = [_failed_group(g, err) for g in request.group_ids or []]
    return ConsumerGroupDescribeResponse(throttle_time_ms=0, groups=groups)


@guarded(_describe_error)
async def consumer_group_describe(ctx: RequestContext, request: Any) -> Any:
    include_ops = bool(getattr(request, "include_authorized_operations", False))  # KIP-430
    groups = [await _describe_one(ctx, g, include_ops) for g in request.group_ids or []]
    return ConsumerGroupDescribeResponse(throttle_time_ms=0, groups=groups)


def _consumer_protocol_assignment(ctx: RequestContext, a: Assignment) -> bytes:
    """A ConsumerProtocolAssignment v0 (what classic members carry) of ``a``."""
    out = [struct.pack(">hi", 0, len(a))]
    for tid, ps in sorted(a.items(), key=lambda kv: str(kv[0])):
        info = ctx.broker.topics.get_by_id(tid)
        name = (info.name if info else str(tid)).encode()
        out.append(struct.pack(">h", len(name)) + name + struct.pack(">i", len(ps)))
        out.extend(struct.pack(">i", p) for p in sorted(ps))
    out.append(struct.pack(">i", -1))  # no user data
    return b"".join(out)


def _consumer_protocol_subscription(topics: tuple[str, ...]) -> bytes:
    """A ConsumerProtocolSubscription v0 of ``topics``."""
    out = [struct.pack(">hi", 0, len(topics))]
    for t in topics:
        name = t.encode()
        out.append(struct.pack(">h", len(name)) + name)
    out.append(struct.pack(">i", -1))
    return b"".join(out)


async def describe_in_classic_terms(
    ctx: RequestContext, consumer: ConsumerGroupCoordinator, group_id: str
) -> Any:
    """DescribeGroups of a consumer group: protocol type ``consumer``, the assignor as the
    protocol, members with their subscription and current assignment in the classic
    consumer protocol's encoding (Kafka answers Dead here; docs/compatibility.md)."""
    group = await consumer.load(group_id)
    described = DescribeGroupsResponse.DescribedGroup
    if group is None:
        return described(
            error_code=0,
            group_id=group_id,
            group_state="Dead",
            protocol_type="",
            protocol_data="",
            members=[],
            authorized_operations=None,
        )
    state = group.state
    members = [
        described.DescribedGroupMember(
            member_id=m.member_id,
            group_instance_id=m.instance_id,
            client_id=m.client_id,
            client_host=m.client_host,
            member_metadata=_consumer_protocol_subscription(m.topics),
            member_assignment=_consumer_protocol_assignment(ctx, m.assigned),
        )
        for m in state.members.values()
    ]
    return described(
        error_code=0,
        group_id=group_id,
        group_state=state.state_name(),
        protocol_type="consumer",
        protocol_data=state.assignor or consumer.config.assignors[0],
        members=members,
        authorized_operations=None,
    )


__all__ = ["consumer_group_describe", "consumer_group_heartbeat", "describe_in_classic_terms"]
