"""Client quotas: DescribeClientQuotas (48) v0-1, AlterClientQuotas (49) v0-1.

Quotas live in the metadata store (``broker.quotas.QuotaStore``), so every broker sees
and enforces the same ones. Entities are ``user`` and ``client-id`` (a null name is the
default entity); keys are ``producer_byte_rate`` and ``consumer_byte_rate``, whole
positive bytes per second, enforced through ``throttle_time_ms`` (``broker/quotas.py``).
Describe filters match as Kafka's do: exact name (0), default (1) or any named entity
(2); ``strict`` asks for entities with exactly the filtered types.

Deviations, refused with INVALID_REQUEST and a message saying why: ``ip`` entities
(connection-rate quotas are not enforced), and the keys Kafka has that this broker does
not enforce (``request_percentage``, ``controller_mutation_rate``). The metadata store
unavailable is a retriable error per entry (REQUEST_TIMED_OUT).

Authorization (docs/operations.md, "ACLs"), as in Kafka: DescribeClientQuotas needs
DESCRIBE_CONFIGS on the cluster (else a top-level CLUSTER_AUTHORIZATION_FAILED),
AlterClientQuotas ALTER_CONFIGS on the cluster (else each entry answers it).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import AlterClientQuotasResponse, DescribeClientQuotasResponse

from broker.handlers.registry import RequestContext
from broker.meta.base import MetaStoreError
from broker.quotas import QuotaError
from broker.security.authz import Operation, allowed_cluster
from protocol.errors import ErrorCode

_DEntry = DescribeClientQuotasResponse.EntryData
_DEntity = _DEntry.EntityData
_DValue = _DEntry.ValueData
_AEntry = AlterClientQuotasResponse.EntryData
_AEntity = _AEntry.EntityData
_DENIED = "Cluster authorization failed."


def _type(part: tuple[str, str | None]) -> str:
    return part[0]


async def describe_client_quotas(ctx: RequestContext, request: Any) -> Any:
    comps = [(c.entity_type, c.match_type, c.match) for c in request.components]
    found: Any
    if not allowed_cluster(ctx, Operation.DESCRIBE_CONFIGS):
        found = QuotaError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, _DENIED)
    else:
        found = ctx.broker.quotas.describe(comps, request.strict)
    if isinstance(found, QuotaError):
        return DescribeClientQuotasResponse(
            throttle_time_ms=0,
            error_code=int(found.code),
            error_message=found.message,
            entries=None,
        )
    entries = [
        _DEntry(
            entity=[_DEntity(entity_type=t, entity_name=n) for t, n in rec.entity],
            values=[_DValue(key=k, value=v) for k, v in sorted(rec.quotas.items())],
        )
        for rec in found
    ]
    return DescribeClientQuotasResponse(
        throttle_time_ms=0, error_code=0, error_message=None, entries=entries
    )


async def alter_client_quotas(ctx: RequestContext, request: Any) -> Any:
    out = []
    denied = not allowed_cluster(ctx, Operation.ALTER_CONFIGS)
    for e in request.entries:
        entity = tuple(sorted(((d.entity_type, d.entity_name) for d in e.entity), key=_type))
        ops = [(o.key, o.value, o.remove) for o in e.ops]
        try:
            error = (
                QuotaError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, _DENIED)
                if denied
                else await ctx.broker.quotas.alter(entity, ops, request.validate_only)
            )
        except MetaStoreError:
            error = QuotaError(ErrorCode.REQUEST_TIMED_OUT, "metadata store unavailable; retry")
        out.append(
            _AEntry(
                error_code=0 if error is None else int(error.code),
                error_message=None if error is None else error.message,
                entity=[
                    _AEntity(entity_type=d.entity_type, entity_name=d.entity_name) for d in e.entity
                ],
            )
        )
    return AlterClientQuotasResponse(throttle_time_ms=0, entries=out)
