"""The write side of a connection: responses in request order, encoded and sent.

A mixin of :class:`broker.connection.Connection`, which owns the state declared below; see
that module's documentation for the rules. The write loop takes the queued answers in
request order, awaits a deferred one (Produce waits for its commit), encodes it, releases
the request's in-flight bytes, starts a quota mute that waits for the response (KIP-219),
and writes: buffers smaller than ``COALESCE`` are joined, larger ones (record bytes) are
written as they are, without a copy. Answers already ready behind the first (the
produces one flush cycle acknowledged) go out with it, up to ``BATCH_BYTES``: one send,
not one per request. While the transport's buffer is full
(``pause_writing``) the loop waits.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from broker.handlers import Encoded
from broker.handlers.registry import handler_failed
from broker.meta.base import MetaStoreError
from protocol.codec import encode_response, error_response
from protocol.errors import ErrorCode
from protocol.frame import RequestHeader
from segments.store import StoreError

if TYPE_CHECKING:
    from broker.request_metrics import ConnectionRecorder
    from broker.security.sasl import Session

log = logging.getLogger(__name__)

#: failures of what the broker depends on (metadata store, object store, network), not
#: of the request or the handler: the connection is closed as before, and clients
#: reconnect and retry (an empty or UNKNOWN_SERVER_ERROR answer would fail their
#: produce for good)
UNAVAILABLE: tuple[type[BaseException], ...] = (MetaStoreError, StoreError, OSError)

COALESCE = 16 * 1024  # buffers smaller than this are joined before writing
BATCH_BYTES = 256 * 1024  # answers ready together are written together up to this size


def _ready(item: Any) -> bool:
    """An answer that can be encoded without waiting."""
    return not isinstance(item, asyncio.Future) or item.done()


def _size(bufs: list[Any]) -> int:
    return sum(b.nbytes if isinstance(b, memoryview) else len(b) for b in bufs)


class Raw:
    """A whole response frame, already encoded (the ApiVersions fallback)."""

    __slots__ = ("buffers",)

    def __init__(self, buffers: list[Any]) -> None:
        self.buffers = buffers


class ResponseWriter:
    # state of the Connection this is mixed into
    transport: asyncio.Transport | None
    peer: str
    rec: ConnectionRecorder
    session: Session
    _closed: bool
    _out: deque[tuple[RequestHeader, Any, int]]
    _out_ready: asyncio.Event
    _can_write: asyncio.Event
    _mute_after: dict[int, int]

    def close(self) -> None:
        raise NotImplementedError

    def _answered(self, size: int) -> None:
        raise NotImplementedError

    def _mute(self, ms: int) -> None:
        raise NotImplementedError

    # -- transport flow control ---------------------------------------------------------
    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    # -- responses ------------------------------------------------------------------------
    async def _write_loop(self) -> None:
        while not self._closed:
            if not self._out:
                self._out_ready.clear()
                await self._out_ready.wait()
                continue
            bufs = await self._answer()
            if bufs is None:
                self.close()
                return
            # answers that are ready behind it (the produces of one flush cycle) go out in
            # the same write: one send per cycle instead of one per request
            size, owned = _size(bufs), False
            while self._out and size < BATCH_BYTES and _ready(self._out[0][1]):
                if self.session.failed:
                    break
                more = await self._answer()
                if more is None:  # the answers before it still go out, then the close
                    self._send(bufs)
                    self.close()
                    return
                if not owned:  # the first answer's list may be its encoder's: extend a copy
                    bufs, owned = list(bufs), True
                bufs.extend(more)
                size += _size(more)
            if bufs:
                self._send(bufs)
                if self.session.failed:  # authentication failed: answered, now close
                    self.close()
                    return
                if not self._can_write.is_set():
                    await self._can_write.wait()

    async def _answer(self) -> list[Any] | None:
        """The next answer in request order, awaited and encoded, its request's bytes
        released; None: the connection must close (logged here)."""
        hdr, item, size = self._out.popleft()
        try:
            if isinstance(item, asyncio.Future):
                item = await item
            bufs = self._encode(hdr, item)
        except UNAVAILABLE:
            log.exception("closing %s: request failed", self.peer)
            return None
        except Exception as exc:  # a deferred handler or an encoder failed
            handler_failed(hdr.api_key, hdr.api_version, exc)
            try:
                bufs = self._encode(
                    hdr, error_response(hdr.api_key, ErrorCode.UNKNOWN_SERVER_ERROR)
                )
            except Exception:
                log.exception("closing %s: response failed", self.peer)
                return None
        self._answered(size)
        if self._mute_after:  # a quota throttle: mute from the response on (KIP-219)
            mute = self._mute_after.pop(hdr.correlation_id, 0)
            if mute > 0:
                self._mute(mute)
        self.rec.finished(item, bufs)
        return [] if bufs is None else bufs

    def _encode(self, hdr: RequestHeader, item: Any) -> list[Any] | None:
        if item is None:
            return None
        if isinstance(item, Raw):
            return item.buffers
        if isinstance(item, Encoded):
            return encode_response(hdr.api_key, hdr.api_version, hdr.correlation_id, item.buffers)
        return encode_response(hdr.api_key, hdr.api_version, hdr.correlation_id, item)

    def _send(self, bufs: list[Any]) -> None:
        transport = self.transport
        if transport is None or self._closed:
            return
        small: list[Any] = []
        small_len = 0
        for b in bufs:
            n = b.nbytes if isinstance(b, memoryview) else len(b)
            if n < COALESCE:
                small.append(b)
                small_len += n
                if small_len >= COALESCE:
                    transport.write(b"".join(small))
                    small, small_len = [], 0
                continue
            if small:
                transport.write(b"".join(small))
                small, small_len = [], 0
            transport.write(b)
        if small:
            transport.write(b"".join(small) if len(small) > 1 else small[0])
