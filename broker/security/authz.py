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
    "authorizer_of",
    "listener_name",
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
