"""InitProducerId (key 22), versions 0-4.

Without a transactional id a new producer id comes from ``/producers/next-id`` (handed
out in blocks of 1000 per broker, compare-and-set) at epoch 0. A v3+ request that names
its current id and epoch (KIP-360, the producer resetting its sequences) keeps the id and
gets the next epoch; at the epoch limit it gets a fresh id. A request with a
transactional id goes to the transaction coordinator (``transactions.py``).
"""

from __future__ import annotations

import logging
from typing import Any

from kafka.protocol.producer import InitProducerIdResponse

from broker.handlers.registry import RequestContext
from broker.handlers.transactions import init_transactional
from broker.meta.base import MetaStoreError
from broker.security.authz import idempotent_write_allowed
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)

MAX_EPOCH = 32767


async def init_producer_id(ctx: RequestContext, request: Any) -> Any:
    if request.transactional_id is not None:
        return await init_transactional(ctx, request)
    if not idempotent_write_allowed(ctx):
        return InitProducerIdResponse(
            throttle_time_ms=0,
            error_code=int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED),
            producer_id=-1,
            producer_epoch=-1,
        )
    pid = getattr(request, "producer_id", -1)
    epoch = getattr(request, "producer_epoch", -1)
    if pid >= 0 and 0 <= epoch < MAX_EPOCH - 1:
        return InitProducerIdResponse(
            throttle_time_ms=0, error_code=0, producer_id=pid, producer_epoch=epoch + 1
        )
    try:
        new_pid = await ctx.broker.producer_ids.allocate()
    except MetaStoreError as exc:  # retriable: the client asks again
        log.warning("allocating a producer id failed: %s", exc)
        return InitProducerIdResponse(
            throttle_time_ms=0,
            error_code=int(ErrorCode.COORDINATOR_NOT_AVAILABLE),
            producer_id=-1,
            producer_epoch=-1,
        )
    return InitProducerIdResponse(
        throttle_time_ms=0, error_code=0, producer_id=new_pid, producer_epoch=0
    )
