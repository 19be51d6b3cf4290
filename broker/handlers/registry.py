"""The handler table and the types handlers use.

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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from protocol.frame import RequestHeader

if TYPE_CHECKING:
    from broker.server import Broker

Buffer = bytes | bytearray | memoryview

log = logging.getLogger(__name__)
_logged_failures: set[tuple[int, str]] = set()


@dataclass(slots=True)
class RequestContext:
    broker: Broker
    header: RequestHeader
    peer: str = ""  # "host:port" of the client
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Encoded:
    """A response body already encoded (without the response header)."""

    buffers: list[Buffer]


Response = Any  # an ApiMessage, Encoded, None, or an awaitable of one of them
Handler = Callable[[RequestContext, Any], Awaitable[Any]]
Decoder = Callable[[memoryview, int], Any]


@dataclass(frozen=True, slots=True)
class ApiHandler:
    key: int
    min_version: int
    max_version: int
    handle: Handler
    decode: Decoder | None = None  # None: protocol.codec.decode_request


REGISTRY: dict[int, ApiHandler] = {}


def api(
    key: int, min_version: int, max_version: int, decode: Decoder | None = None
) -> Callable[[Handler], Handler]:
    """Register ``fn`` as the handler of API ``key`` for versions min..max."""

    def wrap(fn: Handler) -> Handler:
        if key in REGISTRY:
            raise RuntimeError(f"API key {key} registered twice")
        REGISTRY[key] = ApiHandler(key, min_version, max_version, fn, decode)
        return fn

    return wrap


def handler_failed(api_key: int, version: int, exc: BaseException) -> None:
    """Log a handler bug (answered UNKNOWN_SERVER_ERROR for the affected part): with its
    traceback the first time per (API, exception type), then at DEBUG, so one client
    repeating a request that trips it cannot flood the log."""
    key = (api_key, type(exc).__name__)
    if key in _logged_failures:
        log.debug("API %d v%d failed again: %s", api_key, version, key[1])
        return
    _logged_failures.add(key)
    log.error(
        "API %d v%d handler failed; answered UNKNOWN_SERVER_ERROR",
        api_key,
        version,
        exc_info=exc,
    )
