"""The calls handlers make to authorize (docs/operations.md, "Security").

A handler asks ``allowed(ctx, Operation.X, ResourceType.Y, name)`` for each resource it
touches and answers the API's authorization error for that part (per topic/partition
where Kafka answers per partition):

    from broker.security.authz import Operation, ResourceType, allowed
    if not allowed(ctx, Operation.WRITE, ResourceType.TOPIC, topic):
        ...  # ErrorCode.TOPIC_AUTHORIZATION_FAILED for each partition of topic

Without an authorizer (``--authorizer`` off, the default) everything is allowed and the
call costs an attribute lookup.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.security.acl import CLUSTER_NAME, Operation, ResourceType
from broker.security.sasl import ANONYMOUS

if TYPE_CHECKING:
    from broker.handlers.registry import RequestContext
    from broker.security.acl import Authorizer

__all__ = [
    "CLUSTER_NAME",
    "Operation",
    "ResourceType",
    "allowed",
    "allowed_cluster",
    "principal",
    "authorized_operations",
    "authorizer_of",
    "config_denied",
    "idempotent_write_allowed",
    "listener_name",
    "may_create_topic",
]


def authorizer_of(ctx: RequestContext) -> Authorizer | None:
    security = getattr(ctx.broker, "security", None)
    return None if security is None else security.authorizer


def principal(ctx: RequestContext) -> str:
    session = ctx.session
    return session.principal if session is not None else ANONYMOUS


def _host(ctx: RequestContext) -> str:
    peer = ctx.peer
    return peer.rpartition(":")[0].strip("[]") if peer else ""


def allowed(ctx: RequestContext, op: Operation, rtype: ResourceType, name: str) -> bool:
    authorizer = authorizer_of(ctx)
    if authorizer is None:
        return True
    return authorizer.authorize(principal(ctx), _host(ctx), op, rtype, name)


def allowed_cluster(ctx: RequestContext, op: Operation) -> bool:
    return allowed(ctx, op, ResourceType.CLUSTER, CLUSTER_NAME)


def listener_name(ctx: RequestContext) -> str | None:
    """The listener the client came in on (brokers are advertised by it)."""
    session = ctx.session
    return session.listener_name if session is not None else None


def idempotent_write_allowed(ctx: RequestContext) -> bool:
    """An idempotent producer's InitProducerId: IDEMPOTENT_WRITE on the cluster, or WRITE
    on any topic (KIP-679)."""
    authorizer = authorizer_of(ctx)
    if authorizer is None:
        return True
    who, host = principal(ctx), _host(ctx)
    return authorizer.authorize(
        who, host, Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME
    ) or authorizer.authorize_any(who, host, Operation.WRITE, ResourceType.TOPIC)


CONFIG_TOPIC = 2  # DescribeConfigs/AlterConfigs resource types (not the ACL ones)


def config_denied(ctx: RequestContext, op: Operation, config_type: int, name: str) -> int:
    """The error code for DESCRIBE_CONFIGS/ALTER_CONFIGS on a config resource (topic:
    the topic; broker and others: the cluster), or 0 when allowed."""
    if config_type == CONFIG_TOPIC:
        ok = allowed(ctx, op, ResourceType.TOPIC, name)
        return 0 if ok else 29  # TOPIC_AUTHORIZATION_FAILED
    return 0 if allowed_cluster(ctx, op) else 31  # CLUSTER_AUTHORIZATION_FAILED


def may_create_topic(ctx: RequestContext, name: str) -> bool:
    """CREATE on the cluster or on the topic (CreateTopics and auto-creation)."""
    return allowed_cluster(ctx, Operation.CREATE) or allowed(
        ctx, Operation.CREATE, ResourceType.TOPIC, name
    )


_SUPPORTED: dict[ResourceType, tuple[Operation, ...]] = {
    ResourceType.TOPIC: (
        Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DELETE, Operation.ALTER,
        Operation.DESCRIBE, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS,
    ),
    ResourceType.GROUP: (Operation.READ, Operation.DESCRIBE, Operation.DELETE),
    ResourceType.CLUSTER: (
        Operation.CREATE, Operation.CLUSTER_ACTION, Operation.DESCRIBE_CONFIGS,
        Operation.ALTER_CONFIGS, Operation.IDEMPOTENT_WRITE, Operation.ALTER, Operation.DESCRIBE,
    ),
}  # fmt: skip


def authorized_operations(ctx: RequestContext, rtype: ResourceType, name: str) -> set[int]:
    """KIP-430: the operations the principal may perform on the resource, as the set of
    operation codes kafka-python's bitfield type encodes (for Metadata, DescribeCluster
    and DescribeGroups when the client asks for them)."""
    return {int(op) for op in _SUPPORTED[rtype] if allowed(ctx, op, rtype, name)}
