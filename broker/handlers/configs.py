"""Configs: DescribeConfigs (32) v0-4, AlterConfigs (33) v0-2, IncrementalAlterConfigs (44)
v0-1.

Resources: topics (type 2) with the whitelist of ``broker.topic_configs`` (an unknown key is
INVALID_CONFIG naming it), and this broker (type 4, name = its id or "" for the cluster
default) whose configs come from ``BrokerConfig`` and are read-only: altering them is
INVALID_REQUEST. Other resource types (broker loggers, groups, client metrics) get
INVALID_REQUEST. Unknown topics get UNKNOWN_TOPIC_OR_PARTITION per resource.

DescribeConfigs: set topic configs have source DYNAMIC_TOPIC_CONFIG (1), the rest
DEFAULT_CONFIG (5) with ``is_default`` (v0); broker configs STATIC_BROKER_CONFIG (4).
Synonyms (v1+) list the topic value then the broker-level default; types and
documentation from v3. AlterConfigs replaces a topic's whole set of configs, as in Kafka
(keys not given revert to defaults). IncrementalAlterConfigs supports SET, DELETE, and
APPEND/SUBTRACT for list-type configs only (else INVALID_CONFIG). Every change to one
resource is one compare-and-set on the topic's metadata key.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from broker.handlers.registry import RequestContext
from broker.meta.base import MetaStoreError
from broker.security import authz
from broker.topic_configs import ConfigEntry, ResourceType
from broker.topics import TopicManager
from protocol.codec import response_class
from protocol.errors import ErrorCode, KafkaProtocolError

log = logging.getLogger(__name__)

# kafka-python's classes, imported quietly by protocol.codec
DescribeConfigsResponse: Any = response_class(32)
AlterConfigsResponse: Any = response_class(33)
IncrementalAlterConfigsResponse: Any = response_class(44)
_DescribeResult = DescribeConfigsResponse.DescribeConfigsResult
_DescribeEntry = _DescribeResult.DescribeConfigsResourceResult
_DescribeSynonym = _DescribeEntry.DescribeConfigsSynonym
_AlterResult = AlterConfigsResponse.AlterConfigsResourceResponse
_IncrementalResult = IncrementalAlterConfigsResponse.AlterConfigsResourceResponse


def _error_of(exc: Exception) -> tuple[ErrorCode, str]:
    if isinstance(exc, KafkaProtocolError):
        return exc.code, exc.message or exc.code.name
    log.warning("config request failed: %s", exc)
    return ErrorCode.UNKNOWN_SERVER_ERROR, f"metadata store error: {exc}"


# ---------------------------------------------------------------- DescribeConfigs


def _entry(e: ConfigEntry) -> Any:
    return _DescribeEntry(
        name=e.name,
        value=e.value,
        read_only=e.read_only,
        config_source=int(e.source),
        is_default=e.is_default,
        is_sensitive=e.is_sensitive,
        synonyms=[
            _DescribeSynonym(name=s.name, value=s.value, source=int(s.source)) for s in e.synonyms
        ],
        config_type=int(e.config_type),
        documentation=e.documentation,
    )


async def describe_configs(ctx: RequestContext, request: Any) -> Any:
    topics: TopicManager = ctx.broker.topics
    synonyms = bool(getattr(request, "include_synonyms", False))
    docs = bool(getattr(request, "include_documentation", False))
    results = []
    for res in request.resources:
        code, message, entries = ErrorCode.NONE, None, []
        op = authz.Operation.DESCRIBE_CONFIGS
        denied = authz.config_denied(ctx, op, res.resource_type, res.resource_name)
        try:
            if denied:
                raise KafkaProtocolError(ErrorCode(denied), "not authorized")
            entries = topics.describe_configs(
                res.resource_type, res.resource_name, res.configuration_keys, synonyms, docs
            )
        except KafkaProtocolError as exc:
            code, message = _error_of(exc)
        results.append(
            _DescribeResult(
                error_code=int(code),
                error_message=message,
                resource_type=res.resource_type,
                resource_name=res.resource_name,
                configs=[_entry(e) for e in entries],
            )
        )
    return DescribeConfigsResponse(
        version=ctx.header.api_version, throttle_time_ms=0, results=results
    )


# ---------------------------------------------------------------- AlterConfigs


def _not_alterable(ctx: RequestContext, resource_type: int, name: str) -> KafkaProtocolError:
    if resource_type == ResourceType.BROKER:
        if name not in ("", str(ctx.broker.config.node_id)):
            return KafkaProtocolError(ErrorCode.INVALID_REQUEST, f"unexpected broker id {name!r}")
        return KafkaProtocolError(
            ErrorCode.INVALID_REQUEST, "broker configs are static: set them with flags"
        )
    return KafkaProtocolError(
        ErrorCode.INVALID_REQUEST, f"unsupported resource type {resource_type}"
    )


def _twice(names: list[str]) -> KafkaProtocolError | None:
    dups = sorted(n for n, count in Counter(names).items() if count > 1)
    if dups:
        return KafkaProtocolError(ErrorCode.INVALID_REQUEST, f"config(s) given twice: {dups}")
    return None


async def _alter_one(
    ctx: RequestContext, res: Any, validate_only: bool, incremental: bool
) -> Exception | None:
    topics: TopicManager = ctx.broker.topics
    configs = list(res.configs or ())
    op = authz.Operation.ALTER_CONFIGS
    denied = authz.config_denied(ctx, op, res.resource_type, res.resource_name)
    if denied:
        return KafkaProtocolError(ErrorCode(denied), "not authorized")
    if res.resource_type != ResourceType.TOPIC:
        return _not_alterable(ctx, res.resource_type, res.resource_name) if configs else None
    dup = _twice([c.name for c in configs])
    if dup is not None:
        return dup
    try:
        if incremental:
            ops = [(c.name, c.config_operation, c.value) for c in configs]
            await topics.incremental_alter_configs(res.resource_name, ops, validate_only)
        else:
            values = {c.name: c.value for c in configs}
            await topics.alter_configs(res.resource_name, values, (), validate_only, replace=True)
    except (KafkaProtocolError, MetaStoreError) as exc:
        return exc
    return None


async def _alter(
    ctx: RequestContext, request: Any, result_cls: Any, incremental: bool
) -> list[Any]:
    results = []
    validate_only = bool(request.validate_only)
    for res in request.resources:
        exc = await _alter_one(ctx, res, validate_only, incremental)
        code, message = (ErrorCode.NONE, None) if exc is None else _error_of(exc)
        results.append(
            result_cls(
                error_code=int(code),
                error_message=message,
                resource_type=res.resource_type,
                resource_name=res.resource_name,
            )
        )
    return results


async def alter_configs(ctx: RequestContext, request: Any) -> Any:
    results = await _alter(ctx, request, _AlterResult, incremental=False)
    return AlterConfigsResponse(
        version=ctx.header.api_version, throttle_time_ms=0, responses=results
    )


async def incremental_alter_configs(ctx: RequestContext, request: Any) -> Any:
    results = await _alter(ctx, request, _IncrementalResult, incremental=True)
    return IncrementalAlterConfigsResponse(
        version=ctx.header.api_version, throttle_time_ms=0, responses=results
    )
