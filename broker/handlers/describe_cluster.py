"""DescribeCluster (key 60), versions 0-2.

Lists the live brokers (their registrations in the metadata store), the cluster id and
the controller id (the lowest live node id: there is no controller, every broker can
serve every metadata operation). v1 endpoint type 1 (brokers) only; asking for
controllers (2) gets MISMATCHED_ENDPOINT_TYPE. Needs DESCRIBE on the cluster; the
cluster's authorized operations are computed when requested. Brokers are given by the
addresses of the client's listener. v2's ``include_fenced_brokers`` changes nothing:
only live (unfenced) brokers are registered, and each is reported with ``is_fenced``
false.
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import DescribeClusterResponse

from broker.handlers.registry import RequestContext
from broker.security.authz import (
    CLUSTER_NAME,
    Operation,
    ResourceType,
    allowed_cluster,
    authorized_operations,
    listener_name,
)
from protocol.errors import ErrorCode

_Broker = DescribeClusterResponse.DescribeClusterBroker


async def describe_cluster(ctx: RequestContext, request: Any) -> Any:
    broker = ctx.broker
    if not allowed_cluster(ctx, Operation.DESCRIBE):
        return DescribeClusterResponse(
            throttle_time_ms=0,
            error_code=int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED),
            error_message=None,
            endpoint_type=getattr(request, "endpoint_type", 1),
            cluster_id=broker.cluster_id,
            controller_id=-1,
            brokers=[],
        )
    if getattr(request, "endpoint_type", 1) not in (1,):
        return DescribeClusterResponse(
            throttle_time_ms=0,
            error_code=int(ErrorCode.MISMATCHED_ENDPOINT_TYPE),
            error_message="only broker endpoints are served",
            endpoint_type=request.endpoint_type,
            cluster_id=broker.cluster_id,
            controller_id=-1,
            brokers=[],
        )
    return DescribeClusterResponse(
        throttle_time_ms=0,
        error_code=0,
        error_message=None,
        endpoint_type=1,
        cluster_id=broker.cluster_id,
        controller_id=broker.cluster.controller_id(),
        brokers=[
            _Broker(broker_id=b.node_id, host=h, port=p, rack=b.rack)
            for b in broker.cluster.brokers()
            for h, p in (b.address(listener_name(ctx)),)
        ],
        authorized_operations=(
            authorized_operations(ctx, ResourceType.CLUSTER, CLUSTER_NAME)
            if getattr(request, "include_cluster_authorized_operations", False)
            else None
        ),
    )
