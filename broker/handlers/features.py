"""UpdateFeatures (key 57), versions 0-2.

The features this broker reports (ApiVersions: ``broker/handlers/api_versions.py``) are
fixed by its build: there is no feature log to change them in. A request that sets each
feature to the level already finalized (0 for one that is not) succeeds and changes
nothing, so upgrade tools run against an up-to-date cluster pass; any other level, or an
unknown feature, is INVALID_UPDATE_VERSION with a message naming the finalized level.
As in Kafka, v0-1 answer per feature; v2 answers only at the top level, where one
refused update fails the request. Without ALTER on the cluster the answer is
CLUSTER_AUTHORIZATION_FAILED, top-level and (v0-1) for each feature, as in Kafka.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import UpdateFeaturesResponse

from broker.handlers.api_versions import finalized_features, supported_features
from broker.handlers.registry import RequestContext
from broker.security.authz import Operation, allowed_cluster
from protocol.errors import ErrorCode

_Result = UpdateFeaturesResponse.UpdatableFeatureResult


def _check(ctx: RequestContext, name: str, level: int) -> str | None:
    routes = ctx.broker.routes
    if name not in supported_features(routes):
        return f"unknown feature {name!r}"
    current = finalized_features(routes).get(name, 0)
    if level != current:
        return f"{name} is fixed at level {current} by this broker's build"
    return None


def _denied(ctx: RequestContext, request: Any) -> Any:
    code = int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    results = [
        _Result(feature=u.feature, error_code=code, error_message=None)
        for u in request.feature_updates
    ]
    return UpdateFeaturesResponse(
        throttle_time_ms=0,
        error_code=code,
        error_message=None,
        results=results if ctx.header.api_version < 2 else [],
    )


async def update_features(ctx: RequestContext, request: Any) -> Any:
    if not allowed_cluster(ctx, Operation.ALTER):
        return _denied(ctx, request)
    errors = [
        (u.feature, _check(ctx, u.feature, u.max_version_level)) for u in request.feature_updates
    ]
    if ctx.header.api_version >= 2:
        failed = [msg for _name, msg in errors if msg is not None]
        code = ErrorCode.INVALID_UPDATE_VERSION if failed else ErrorCode.NONE
        return UpdateFeaturesResponse(
            throttle_time_ms=0,
            error_code=int(code),
            error_message="; ".join(failed) if failed else None,
        )
    results = [
        _Result(
            feature=name,
            error_code=int(ErrorCode.INVALID_UPDATE_VERSION if msg else ErrorCode.NONE),
            error_message=msg,
        )
        for name, msg in errors
    ]
    return UpdateFeaturesResponse(
        throttle_time_ms=0, error_code=0, error_message=None, results=results
    )
