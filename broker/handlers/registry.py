"""The types of the route table and of handlers (the table itself: ``routes.py``).

A handler is ``async def handle(ctx, request) -> Response``, where ``request`` is what the
API's decoder returned (by default the kafka-python ``ApiMessage`` for the version) and the
response is one of:

- a kafka-python ``ApiMessage`` response instance (the connection encodes it with the
  right response-header version),
- ``Encoded(buffers)``: a body already encoded as a list of buffers (fast paths),
- ``None``: send nothing (acks=0 Produce),
- an ``asyncio.Future``/coroutine resolving to one of the above: a *deferred* response.
  The connection queues it and goes on reading requests; responses are still written in
  request order. Produce returns deferred responses so commits can pipeline.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from protocol.apis import api_name
from protocol.frame import RequestHeader

if TYPE_CHECKING:
    from broker.cluster import Cluster
    from broker.config import BrokerConfig
    from broker.fetch_sessions import FetchSessionCache
    from broker.logs import LogManager
    from broker.quotas import QuotaStore
    from broker.security.sasl import Session
    from broker.topics import TopicManager
    from broker.txn_coordinator import TxnCoordinator
    from broker.txn_markers import MarkerWriter
    from groupcoord import GroupCoordinator

Buffer = bytes | bytearray | memoryview

log = logging.getLogger(__name__)
_logged_failures: set[tuple[int, str]] = set()


class ProducerIdSource(Protocol):
    async def allocate(self) -> int: ...


class BrokerContext(Protocol):
    """What handlers use of the broker (``server.Broker`` provides it); handlers depend
    on this, never on the concrete server."""

    @property
    def config(self) -> BrokerConfig: ...
    @property
    def topics(self) -> TopicManager: ...
    @property
    def logs(self) -> LogManager: ...
    @property
    def cluster(self) -> Cluster: ...
    @property
    def groups(self) -> GroupCoordinator | None: ...
    @property
    def producer_ids(self) -> ProducerIdSource: ...
    @property
    def txns(self) -> TxnCoordinator | None: ...
    @property
    def markers(self) -> MarkerWriter | None: ...
    @property
    def routes(self) -> Routes: ...
    @property
    def cluster_id(self) -> str: ...
    @property
    def quotas(self) -> QuotaStore: ...
    @property
    def fetch_sessions(self) -> FetchSessionCache: ...


@dataclass(slots=True)
class RequestContext:
    broker: BrokerContext
    header: RequestHeader
    peer: str = ""  # "host:port" of the client
    session: Session | None = None  # listener + principal (broker.security.sasl)
    # set by a handler whose client went over its quota (broker/quotas.py): the
    # connection stops reading this long once the response is sent (KIP-219)
    throttle_ms: int = 0


@dataclass(frozen=True, slots=True)
class Encoded:
    """A response body already encoded (without the response header)."""

    buffers: list[Buffer]
    # what was encoded (its ``topics[].partitions[].error_code``), for the response
    # metrics (broker/request_metrics.py); None: not counted
    source: Any = None


Response = Any  # an ApiMessage, Encoded, None, or an awaitable of one of them
Handler = Callable[[RequestContext, Any], Awaitable[Any]]
Decoder = Callable[[memoryview, int], Any]


@dataclass(frozen=True, slots=True)
class ApiHandler:
    """One route: an API key, the versions served, its handler and its decoder."""

    key: int
    min_version: int
    max_version: int
    handle: Handler
    decode: Decoder | None = None  # None: protocol.codec.decode_request


Routes = Mapping[int, ApiHandler]


def handler_failed(api_key: int, version: int, exc: BaseException) -> None:
    """Log a handler bug (answered UNKNOWN_SERVER_ERROR for the affected part): with its
    traceback the first time per (API, exception type), then at DEBUG, so one client
    repeating a request that trips it cannot flood the log."""
    key = (api_key, type(exc).__name__)
    if key in _logged_failures:
        log.debug("API %s v%d failed again: %s", api_name(api_key), version, key[1])
        return
    _logged_failures.add(key)
    log.error(
        "API %s v%d handler failed; answered UNKNOWN_SERVER_ERROR",
        api_name(api_key),
        version,
        exc_info=exc,
    )
