"""CreateAcls (30) v1-3, DescribeAcls (29) v1-3, DeleteAcls (31) v1-3 (Kafka 4's range;
docs/operations.md, "Security").

Bindings live in the metadata store (``broker.security.store.AclStore``) and take effect
on every broker through its watch. Creating and deleting need ALTER on the cluster,
describing DESCRIBE on the cluster. Without ``--authorizer`` every request answers
SECURITY_DISABLED, as Kafka does without an authorizer. DescribeAcls reads this broker's
cache (what it enforces); DeleteAcls matches against the store itself.
"""

from __future__ import annotations

import logging
from typing import Any

from kafka.protocol.admin import CreateAclsResponse, DeleteAclsResponse, DescribeAclsResponse

from broker.handlers.registry import RequestContext
from broker.meta.base import MetaStoreError
from broker.security.acl import (
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from broker.security.authz import allowed_cluster, authorizer_of
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)

_Created = CreateAclsResponse.AclCreationResult
_Resource = DescribeAclsResponse.DescribeAclsResource
_Description = _Resource.AclDescription
_FilterResult = DeleteAclsResponse.DeleteAclsFilterResult
_Matching = _FilterResult.DeleteAclsMatchingAcl


def _enum(cls: Any, value: int) -> Any:
    try:
        return cls(value)
    except ValueError:
        return cls(0)  # UNKNOWN


def _filter(f: Any, prefix: str = "") -> AclFilter:
    g = lambda name: getattr(f, prefix + name)  # noqa: E731
    return AclFilter(
        _enum(ResourceType, g("resource_type_filter")),
        _enum(PatternType, getattr(f, "pattern_type_filter", PatternType.LITERAL)),
        g("resource_name_filter"),
        g("principal_filter"),
        g("host_filter"),
        _enum(Operation, f.operation),
        _enum(Permission, f.permission_type),
    )


def _disabled(ctx: RequestContext) -> bool:
    return authorizer_of(ctx) is None


async def create_acls(ctx: RequestContext, request: Any) -> Any:
    n = len(request.creations)
    if _disabled(ctx) or not allowed_cluster(ctx, Operation.ALTER):
        code = (
            ErrorCode.SECURITY_DISABLED
            if _disabled(ctx)
            else ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        )
        return CreateAclsResponse(
            throttle_time_ms=0, results=[_Created(error_code=int(code), error_message=None)] * n
        )
    results: list[Any] = []
    valid: list[AclBinding] = []
    for c in request.creations:
        b = AclBinding(
            _enum(ResourceType, c.resource_type),
            _enum(PatternType, getattr(c, "resource_pattern_type", PatternType.LITERAL)),
            c.resource_name or "",
            c.principal or "",
            c.host or "",
            _enum(Operation, c.operation),
            _enum(Permission, c.permission_type),
        )
        why = b.invalid()
        if why is not None:
            results.append(_Created(error_code=int(ErrorCode.INVALID_REQUEST), error_message=why))
            continue
        valid.append(b)
        results.append(_Created(error_code=0, error_message=None))
    try:
        await ctx.broker.security.acls.create(valid)  # type: ignore[attr-defined]
    except MetaStoreError as exc:
        log.warning("creating ACLs failed: %s", exc)
        results = [
            r if r.error_code else _Created(error_code=int(ErrorCode.UNKNOWN_SERVER_ERROR),
                                            error_message="metadata store unavailable")
            for r in results
        ]  # fmt: skip
    return CreateAclsResponse(throttle_time_ms=0, results=results)


async def describe_acls(ctx: RequestContext, request: Any) -> Any:
    def error(code: ErrorCode, message: str | None = None) -> Any:
        return DescribeAclsResponse(
            throttle_time_ms=0, error_code=int(code), error_message=message, resources=[]
        )

    if _disabled(ctx):
        return error(ErrorCode.SECURITY_DISABLED, "no authorizer is configured")
    if not allowed_cluster(ctx, Operation.DESCRIBE):
        return error(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    f = _filter(request)
    why = f.invalid()
    if why is not None:
        return error(ErrorCode.INVALID_REQUEST, why)
    found = ctx.broker.security.acls.describe(f)  # type: ignore[attr-defined]
    groups: dict[tuple[int, str, int], list[Any]] = {}
    for b in sorted(found, key=lambda b: (b.resource_type, b.name, b.pattern_type, b.principal)):
        key = (int(b.resource_type), b.name, int(b.pattern_type))
        groups.setdefault(key, []).append(
            _Description(
                principal=b.principal,
                host=b.host,
                operation=int(b.operation),
                permission_type=int(b.permission),
            )
        )
    resources = [
        _Resource(resource_type=rt, resource_name=name, pattern_type=pt, acls=acls)
        for (rt, name, pt), acls in groups.items()
    ]
    return DescribeAclsResponse(
        throttle_time_ms=0, error_code=0, error_message=None, resources=resources
    )


async def delete_acls(ctx: RequestContext, request: Any) -> Any:
    n = len(request.filters)

    def all_failed(code: ErrorCode, message: str | None = None) -> Any:
        results = [_FilterResult(error_code=int(code), error_message=message, matching_acls=[])] * n
        return DeleteAclsResponse(throttle_time_ms=0, filter_results=results)

    if _disabled(ctx):
        return all_failed(ErrorCode.SECURITY_DISABLED, "no authorizer is configured")
    if not allowed_cluster(ctx, Operation.ALTER):
        return all_failed(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    filters = [_filter(f) for f in request.filters]
    usable = [f for f in filters if f.invalid() is None]
    try:
        deleted = await ctx.broker.security.acls.delete(usable)  # type: ignore[attr-defined]
    except MetaStoreError as exc:
        log.warning("deleting ACLs failed: %s", exc)
        return all_failed(ErrorCode.UNKNOWN_SERVER_ERROR, "metadata store unavailable")
    it = iter(deleted)
    results = []
    for f in filters:
        why = f.invalid()
        if why is not None:
            results.append(
                _FilterResult(
                    error_code=int(ErrorCode.INVALID_REQUEST), error_message=why, matching_acls=[]
                )
            )
            continue
        matching = [
            _Matching(
                error_code=0,
                error_message=None,
                resource_type=int(b.resource_type),
                resource_name=b.name,
                pattern_type=int(b.pattern_type),
                principal=b.principal,
                host=b.host,
                operation=int(b.operation),
                permission_type=int(b.permission),
            )
            for b in next(it)
        ]
        results.append(_FilterResult(error_code=0, error_message=None, matching_acls=matching))
    return DeleteAclsResponse(throttle_time_ms=0, filter_results=results)
