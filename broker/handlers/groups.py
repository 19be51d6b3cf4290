"""Group membership and group admin APIs, on ``groupcoord.GroupCoordinator``.

Supported versions:

- FindCoordinator (10) v0-4: v4 answers batched ``coordinator_keys``. Key type 0 (group)
  names the group's owner (docs/architecture.md, ownership); key type 1 (transaction)
  names the transactional id's coordinator, placed the same way (``broker.txn_coordinator``).
- JoinGroup (11) v0-9: MEMBER_ID_REQUIRED from v4; static membership from v5; v9's
  ``skip_assignment`` is set for a static leader that rejoined a Stable group (older
  versions get the member list instead and their new assignment is ignored, as in Kafka
  before KIP-814). Member metadata above ``MAX_MEMBER_METADATA_BYTES`` (128 KiB) gets
  INVALID_REQUEST. v0 (no rebalance timeout) uses the session timeout for both.
- SyncGroup (14) v0-5, Heartbeat (12) v0-4, LeaveGroup (13) v0-5 (batch from v3).
- DescribeGroups (15) v0-5: authorized operations computed when requested (v3+). An
  unknown group is reported as state ``Dead``. A KIP-848 consumer group is described in
  classic terms (Kafka answers ``Dead``).
- JoinGroup on a KIP-848 consumer group with members: INCONSISTENT_GROUP_PROTOCOL; on an
  empty one the group becomes classic (offsets kept).
- ListGroups (16) v0-5: v4 states filter (case-insensitive), v5 types filter (``classic``,
  ``consumer``: KIP-848 groups, broker/handlers/consumer_groups.py); lists only groups this broker
  coordinates, as Kafka does.
- DeleteGroups (42) v0-2.

A group this broker does not own gets NOT_COORDINATOR; when the coordinator is not running
(minimal builds) every group request gets COORDINATOR_NOT_AVAILABLE.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from kafka.protocol.admin import (
    DeleteGroupsResponse,
    DescribeGroupsResponse,
    ListGroupsResponse,
)
from kafka.protocol.consumer import (
    HeartbeatResponse,
    JoinGroupResponse,
    LeaveGroupResponse,
    SyncGroupResponse,
)
from kafka.protocol.metadata import FindCoordinatorResponse

from broker.handlers.registry import Handler, RequestContext
from broker.security.authz import (
    Operation,
    ResourceType,
    allowed,
    allowed_cluster,
    authorized_operations,
    listener_name,
)
from groupcoord import GroupCoordinator, JoinRequest, JoinResult
from protocol.errors import ErrorCode

_Coordinator = FindCoordinatorResponse.Coordinator
_JoinMember = JoinGroupResponse.JoinGroupResponseMember
_LeaveMember = LeaveGroupResponse.MemberResponse
_Described = DescribeGroupsResponse.DescribedGroup
_DescribedMember = _Described.DescribedGroupMember
_Listed = ListGroupsResponse.ListedGroup
_Deleted = DeleteGroupsResponse.DeletableGroupResult

log = logging.getLogger(__name__)
Fallback = Callable[[RequestContext, Any, ErrorCode], Any]


def guarded(fallback: Fallback) -> Callable[[Handler], Handler]:
    """Answer COORDINATOR_NOT_AVAILABLE (retriable) when the metadata store fails, instead
    of letting the connection close."""

    def wrap(fn: Handler) -> Handler:
        @functools.wraps(fn)
        async def handle(ctx: RequestContext, request: Any) -> Any:
            try:
                return await fn(ctx, request)
            except Exception as exc:  # noqa: BLE001 - store/network failure
                log.warning("%s failed for %s: %r", fn.__name__, ctx.peer, exc)
                return fallback(ctx, request, ErrorCode.COORDINATOR_NOT_AVAILABLE)

        return handle

    return wrap


def group_error(
    ctx: RequestContext, group_id: str, op: Operation = Operation.READ
) -> ErrorCode | None:
    """The error for a group request this broker cannot serve (or ``op`` on the group
    is not authorized), or None."""
    if not allowed(ctx, op, ResourceType.GROUP, group_id):
        return ErrorCode.GROUP_AUTHORIZATION_FAILED
    if ctx.broker.groups is None:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if not ctx.broker.cluster.owns_group(group_id):
        ctx.broker.groups.unload(group_id)  # stale if we owned it before
        return ErrorCode.NOT_COORDINATOR
    return None


def coordinator(ctx: RequestContext) -> GroupCoordinator:
    """The group coordinator (callers checked ``group_error`` or ``_find`` first)."""
    groups = ctx.broker.groups
    assert groups is not None
    return groups


def client_host(ctx: RequestContext) -> str:
    host = ctx.peer.rsplit(":", 1)[0] if ctx.peer else ""
    return f"/{host.strip('[]')}"


# ---- FindCoordinator ----


def _find(ctx: RequestContext, key: str, key_type: int) -> tuple[ErrorCode, int, str, int]:
    if key_type == 1:  # a transactional id (docs/architecture.md, transactions)
        if not allowed(ctx, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, key):
            return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1, "", -1
        if ctx.broker.txns is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, -1, "", -1
        info = ctx.broker.txns.coordinator_of(key)
        host, port = info.address(listener_name(ctx))
        return ErrorCode.NONE, info.node_id, host, port
    if key_type != 0:
        return ErrorCode.INVALID_REQUEST, -1, "", -1
    if ctx.broker.groups is None:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE, -1, "", -1
    if not allowed(ctx, Operation.DESCRIBE, ResourceType.GROUP, key):
        return ErrorCode.GROUP_AUTHORIZATION_FAILED, -1, "", -1
    info = ctx.broker.cluster.group_coordinator(key)
    host, port = info.address(listener_name(ctx))
    return ErrorCode.NONE, info.node_id, host, port


async def find_coordinator(ctx: RequestContext, request: Any) -> Any:
    key_type = getattr(request, "key_type", 0) or 0
    if ctx.header.api_version >= 4:
        coords = []
        for key in request.coordinator_keys or []:
            err, node, host, port = _find(ctx, key, key_type)
            coords.append(
                _Coordinator(
                    key=key,
                    node_id=node,
                    host=host,
                    port=port,
                    error_code=int(err),
                    error_message=None,
                )
            )
        return FindCoordinatorResponse(throttle_time_ms=0, coordinators=coords)
    err, node, host, port = _find(ctx, request.key, key_type)
    return FindCoordinatorResponse(
        throttle_time_ms=0,
        error_code=int(err),
        error_message=None,
        node_id=node,
        host=host,
        port=port,
    )


# ---- JoinGroup / SyncGroup / Heartbeat / LeaveGroup ----


def _join_response(version: int, res: JoinResult) -> Any:
    members = [
        _JoinMember(member_id=m.member_id, group_instance_id=m.instance_id, metadata=m.metadata)
        for m in res.members
    ]
    name = res.protocol_name
    return JoinGroupResponse(
        throttle_time_ms=0,
        error_code=int(res.error),
        generation_id=res.generation,
        protocol_type=res.protocol_type,
        protocol_name=name if name is not None or version >= 7 else "",
        leader=res.leader,
        skip_assignment=res.skip_assignment and version >= 9,
        member_id=res.member_id,
        members=members,
    )


@guarded(
    lambda ctx, r, e: _join_response(ctx.header.api_version, JoinResult(e, member_id=r.member_id))
)
async def join_group(ctx: RequestContext, request: Any) -> Any:
    version = ctx.header.api_version
    err = group_error(ctx, request.group_id)
    if err is not None:
        return _join_response(version, JoinResult(err, member_id=request.member_id))
    consumer = coordinator(ctx).consumer
    refusal = await consumer.downgrade_error(request.group_id) if consumer is not None else None
    if refusal is not None:
        log.info("JoinGroup from %s refused: %s", ctx.peer, refusal)
        err = ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        return _join_response(version, JoinResult(err, member_id=request.member_id))
    session = request.session_timeout_ms
    rebalance = getattr(request, "rebalance_timeout_ms", -1) if version >= 1 else -1
    req = JoinRequest(
        group_id=request.group_id,
        member_id=request.member_id or "",
        instance_id=getattr(request, "group_instance_id", None) if version >= 5 else None,
        client_id=ctx.header.client_id or "",
        client_host=client_host(ctx),
        session_timeout_ms=session,
        rebalance_timeout_ms=rebalance if rebalance is not None and rebalance > 0 else session,
        protocol_type=request.protocol_type,
        protocols=tuple((p.name, bytes(p.metadata)) for p in request.protocols or []),
        require_known_member_id=version >= 4,
    )
    return _join_response(version, await coordinator(ctx).join_group(req))


@guarded(lambda ctx, r, e: SyncGroupResponse(throttle_time_ms=0, error_code=int(e), assignment=b""))
async def sync_group(ctx: RequestContext, request: Any) -> Any:
    version = ctx.header.api_version
    err = group_error(ctx, request.group_id)
    if err is not None:
        return SyncGroupResponse(throttle_time_ms=0, error_code=int(err), assignment=b"")
    res = await coordinator(ctx).sync_group(
        request.group_id,
        request.generation_id,
        request.member_id,
        getattr(request, "group_instance_id", None) if version >= 3 else None,
        {a.member_id: bytes(a.assignment) for a in request.assignments or []},
        getattr(request, "protocol_type", None) if version >= 5 else None,
        getattr(request, "protocol_name", None) if version >= 5 else None,
    )
    return SyncGroupResponse(
        throttle_time_ms=0,
        error_code=int(res.error),
        protocol_type=res.protocol_type,
        protocol_name=res.protocol_name,
        assignment=res.assignment,
    )


@guarded(lambda ctx, r, e: HeartbeatResponse(throttle_time_ms=0, error_code=int(e)))
async def heartbeat(ctx: RequestContext, request: Any) -> Any:
    version = ctx.header.api_version
    err = group_error(ctx, request.group_id)
    if err is None:
        err = await coordinator(ctx).heartbeat(
            request.group_id,
            request.generation_id,
            request.member_id,
            getattr(request, "group_instance_id", None) if version >= 3 else None,
        )
    return HeartbeatResponse(throttle_time_ms=0, error_code=int(err))


@guarded(lambda ctx, r, e: LeaveGroupResponse(throttle_time_ms=0, error_code=int(e), members=[]))
async def leave_group(ctx: RequestContext, request: Any) -> Any:
    version = ctx.header.api_version
    if version >= 3:
        members = [(m.member_id or "", m.group_instance_id) for m in request.members or []]
    else:
        members = [(request.member_id, None)]
    err = group_error(ctx, request.group_id)
    if err is not None:
        top, per = err, [err] * len(members)
    else:
        top, per = await coordinator(ctx).leave_group(request.group_id, members)
    if version < 3:
        return LeaveGroupResponse(throttle_time_ms=0, error_code=int(per[0] if top == 0 else top))
    return LeaveGroupResponse(
        throttle_time_ms=0,
        error_code=int(top),
        members=[
            _LeaveMember(member_id=mid, group_instance_id=iid, error_code=int(e))
            for (mid, iid), e in zip(members, per, strict=True)
        ],
    )


# ---- DescribeGroups / ListGroups / DeleteGroups ----


def _error_described(group_id: str, err: ErrorCode) -> Any:
    return _Described(
        error_code=int(err),
        group_id=group_id,
        group_state="",
        protocol_type="",
        protocol_data="",
        members=[],
        authorized_operations=None,
    )


async def _describe(ctx: RequestContext, group_id: str, include_ops: bool = False) -> Any:
    err = group_error(ctx, group_id, Operation.DESCRIBE)
    if err is not None:
        return _error_described(group_id, err)
    consumer = coordinator(ctx).consumer
    if consumer is not None and await consumer.exists(group_id):
        from broker.handlers.consumer_groups import describe_in_classic_terms

        return await describe_in_classic_terms(ctx, consumer, group_id)
    d = await coordinator(ctx).describe_group(group_id)
    members = [
        _DescribedMember(
            member_id=m.member_id,
            group_instance_id=m.instance_id,
            client_id=m.client_id,
            client_host=m.client_host,
            member_metadata=m.metadata,
            member_assignment=m.assignment,
        )
        for m in d.members
    ]
    return _Described(
        error_code=int(d.error),
        group_id=group_id,
        group_state=d.state,
        protocol_type=d.protocol_type,
        protocol_data=d.protocol_name,
        members=members,
        authorized_operations=authorized_operations(ctx, ResourceType.GROUP, group_id)
        if include_ops
        else None,
    )


def _describe_error(ctx: RequestContext, request: Any, err: ErrorCode) -> Any:
    groups = [_error_described(g, err) for g in request.groups or []]
    return DescribeGroupsResponse(throttle_time_ms=0, groups=groups)


@guarded(_describe_error)
async def describe_groups(ctx: RequestContext, request: Any) -> Any:
    ops = bool(getattr(request, "include_authorized_operations", False))  # KIP-430
    groups = [await _describe(ctx, g, ops) for g in request.groups or []]
    return DescribeGroupsResponse(throttle_time_ms=0, groups=groups)


@guarded(lambda ctx, r, e: ListGroupsResponse(throttle_time_ms=0, error_code=int(e), groups=[]))
async def list_groups(ctx: RequestContext, request: Any) -> Any:
    if ctx.broker.groups is None:
        return ListGroupsResponse(
            throttle_time_ms=0, error_code=int(ErrorCode.COORDINATOR_NOT_AVAILABLE), groups=[]
        )
    states = getattr(request, "states_filter", None) if ctx.header.api_version >= 4 else None
    types = getattr(request, "types_filter", None) if ctx.header.api_version >= 5 else None
    wanted_types = {t.strip().lower() for t in types} if types else None
    owns = ctx.broker.cluster.owns_group
    listed = []
    for g in await coordinator(ctx).list_groups(states or None):
        if not owns(g.group_id) or (wanted_types is not None and g.group_type not in wanted_types):
            continue
        if not (
            allowed_cluster(ctx, Operation.DESCRIBE)
            or allowed(ctx, Operation.DESCRIBE, ResourceType.GROUP, g.group_id)
        ):
            continue
        listed.append(
            _Listed(
                group_id=g.group_id,
                protocol_type=g.protocol_type,
                group_state=g.state,
                group_type=g.group_type,
            )
        )
    return ListGroupsResponse(throttle_time_ms=0, error_code=0, groups=listed)


@guarded(
    lambda ctx, r, e: DeleteGroupsResponse(
        throttle_time_ms=0,
        results=[_Deleted(group_id=g, error_code=int(e)) for g in r.groups_names or []],
    )
)
async def delete_groups(ctx: RequestContext, request: Any) -> Any:
    results = []
    for group_id in request.groups_names or []:
        err = group_error(ctx, group_id, Operation.DELETE)
        if err is None:
            err = (await coordinator(ctx).delete_groups([group_id]))[group_id]
        results.append(_Deleted(group_id=group_id, error_code=int(err)))
    return DeleteGroupsResponse(throttle_time_ms=0, results=results)
