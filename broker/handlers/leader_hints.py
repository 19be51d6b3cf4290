"""KIP-951 leader hints for Produce (v10+) and Fetch (v12+; endpoints v16+).

A partition answered NOT_LEADER_OR_FOLLOWER names the broker that owns it now, with the
leader epoch this broker knows, exactly as a Metadata request to this broker would
answer at that moment, and the response carries that broker's endpoint on the client's
listener. A client that understands them (librdkafka 2.5+, the Java client 3.7+) goes to
the new owner without asking for Metadata first; a hint is a hint, and a client that acts
on a stale one is answered NOT_LEADER_OR_FOLLOWER again and refreshes its metadata.

Nothing is named when this broker is the owner by the hash (its lease in doubt, or the
partition being taken), or when no epoch is known (no owner key: clients treat -1 as
older than any epoch they hold).
Encoding: ``protocol.leader_hints``.
"""

from __future__ import annotations

from collections.abc import Iterable

from broker.handlers.registry import RequestContext
from broker.security.authz import listener_name
from protocol.errors import ErrorCode
from protocol.leader_hints import NodeEndpoint

MOVED = int(ErrorCode.NOT_LEADER_OR_FOLLOWER)


def current_leader(ctx: RequestContext, topic: str, partition: int) -> tuple[int, int] | None:
    """(leader id, leader epoch) of a partition another broker owns now, or None."""
    cluster = ctx.broker.cluster
    owner = cluster.partition_owner(topic, partition)
    if owner.node_id == cluster.me.node_id:  # the owner is always a serving broker
        return None
    epoch = cluster.leader_epoch(topic, partition)
    return (owner.node_id, epoch) if epoch >= 0 else None


def endpoints(ctx: RequestContext, leaders: Iterable[int]) -> list[NodeEndpoint]:
    """The endpoints of ``leaders`` on the listener the client came in on."""
    cluster = ctx.broker.cluster
    listener = listener_name(ctx)
    out = []
    for node in sorted(set(leaders)):
        b = cluster.broker(node)
        if b is not None:
            host, port = b.address(listener)
            out.append(NodeEndpoint(node, host, port, b.rack))
    return out
