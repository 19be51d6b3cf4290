"""One client connection: framing, in-order dispatch, pipelined responses.

Reading: a ``BufferedProtocol``. Small frames are parsed out of a scratch buffer; a frame
that does not fit gets its own ``bytearray`` and the socket reads straight into it, so
record bytes are copied at most once between the socket and the segment. Each frame stays
one writable buffer: handlers slice it into ``memoryview``s and patch batch headers in
place.

Dispatch: requests are decoded and handled one at a time, in arrival order. A handler
may return a deferred response (Produce waits for its commit): it is queued and the next
request is read at once. The writer sends responses strictly in request order
(``broker/conn_writer.py``; partial frames: ``broker/frames.py``).

Admission control: the bytes of frames read but not yet answered are counted per
connection and per broker; past either limit the connection stops reading (TCP pushes
back on the client) until responses go out.

Memory before a frame arrives (issue 16): a frame's announced length is checked against
``--max-request-bytes`` as soon as it is read, then *reserved* against the broker-wide
``--queued-max-request-bytes`` budget (Kafka's queued.max.request.bytes); without room
the connection stops reading until other frames complete. The reservation is only an
account: the frame's buffer starts small and doubles as its bytes arrive, so a client
that announces 100 MiB and sends nothing costs a few KiB. A frame must be complete
within ``--request-read-timeout-ms`` of its length (the clock stops while the broker
itself is not reading the connection), or the connection is closed.

Handler failures: a request that decodes always gets an answer. A handler that raises
(a bug) gets ``protocol.codec.error_response`` (UNKNOWN_SERVER_ERROR where the response
has a top-level error code, empty results otherwise); each (API, exception type) is logged
with its traceback once, then at DEBUG. The exception: the metadata or object store being
unavailable (``UNAVAILABLE``) closes the connection, so that clients reconnect and retry
instead of failing their records.

Security (docs/operations.md, "Security"): each connection belongs to a listener and has a
``broker.security.sasl.Session``. On a SASL listener only ApiVersions and the SASL APIs
are served before authentication (anything else closes the connection), the connection
is closed if it has not authenticated within ``--sasl-auth-timeout-ms``, frames above
512 KiB before authentication close it (Kafka's ``sasl.server.max.receive.size``), and a
failed authentication closes it once its answer is written. After SaslHandshake v0 the SASL
tokens arrive as bare frames without a request header.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket
from collections import deque
from typing import TYPE_CHECKING, Any

from broker.conn_writer import UNAVAILABLE, Raw, ResponseWriter
from broker.frames import PartialFrames
from broker.handlers import RequestContext
from broker.handlers.registry import handler_failed
from broker.security.config import Listener
from broker.security.sasl import Session, authenticate_step
from protocol.apis import ApiKey
from protocol.codec import api_versions_fallback, decode_request, error_response
from protocol.errors import ErrorCode, KafkaProtocolError
from protocol.frame import RequestHeader, parse_request_header

if TYPE_CHECKING:
    from broker.request_metrics import RequestRecorder
    from broker.server import Broker

log = logging.getLogger(__name__)

SCRATCH = 256 * 1024
PRE_AUTH_MAX_BYTES = 512 * 1024  # largest frame before SASL authentication


class Connection(PartialFrames, ResponseWriter, asyncio.BufferedProtocol):
    def __init__(
        self,
        broker: Broker,
        listener: Listener | None = None,
        recorder: RequestRecorder | None = None,
    ) -> None:
        self.broker = broker
        self.listener = listener
        self.session = Session(listener)
        self._auth_timer: asyncio.TimerHandle | None = None
        # the metrics hook (broker/request_metrics.py): the one place requests are timed
        self.rec = (recorder or broker.requests).connection()
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self._scratch = bytearray(SCRATCH)
        self._scratch_view = memoryview(self._scratch)
        self._filled = 0
        self._frame: bytearray | None = None
        self._frame_pos = 0
        self._frame_size = 0  # announced length of the frame being received
        self.reserved = 0  # bytes of that frame reserved against the broker's budget
        self.waiting_for_memory = 0  # a frame length that found no room (0: none)
        self._read_timer: asyncio.TimerHandle | None = None
        self._frames: deque[bytearray] = deque()
        self._frames_ready = asyncio.Event()
        self._out: deque[tuple[RequestHeader, Any, int]] = deque()
        self._out_ready = asyncio.Event()
        self._can_write = asyncio.Event()
        self._can_write.set()
        self.inflight = 0
        self._paused = False  # admission control (in-flight bytes)
        self._transport_paused = False
        self._closed = False
        self._busy = False  # a request is being handled
        self._draining = False  # the peer hung up: finish the requests it already sent
        self._tasks: list[asyncio.Task[None]] = []
        self._mute_after: dict[int, int] = {}  # correlation id -> quota throttle ms
        self._muted: asyncio.TimerHandle | None = None
        self._unmuted = asyncio.Event()
        self._unmuted.set()

    # -- transport callbacks ------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is duck-typed
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else ""
        self._start_session(transport)
        self.broker.connections.add(self)
        self.rec.opened()
        self._tasks = [
            asyncio.create_task(self._process_loop(), name=f"conn-process {self.peer}"),
            asyncio.create_task(self._write_loop(), name=f"conn-write {self.peer}"),
        ]

    def _start_session(self, transport: asyncio.BaseTransport) -> None:
        security = getattr(self.broker, "security", None)
        if security is None or self.listener is None:
            return
        self.session = security.session(self.listener, transport.get_extra_info("peercert"))
        if self.session.sasl:
            timeout = security.config.auth_timeout_ms / 1000
            self._auth_timer = asyncio.get_running_loop().call_later(timeout, self._auth_expired)

    def _auth_expired(self) -> None:
        self._auth_timer = None
        if not self.session.authenticated and not self._closed:
            log.warning("closing %s: not authenticated in time", self.peer)
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._auth_timer is not None:
            self._auth_timer.cancel()
            self._auth_timer = None
        peer_closed = not self._closed
        self._closed = True
        self.broker.connections.discard(self)
        self.rec.closed()
        self.broker.admission.forget(self)
        self._drop_partial()
        if peer_closed and (self._busy or self._frames) and len(self._tasks) == 2:
            # Requests the peer sent before hanging up still take effect (an acks=0
            # produce has no other way to); nobody is left to answer them. The process
            # loop finishes them and then releases the in-flight bytes.
            self._draining = True
            self._tasks[1].cancel()
            self._frames_ready.set()
            return
        self._release_all()
        for t in self._tasks:
            t.cancel()

    def _release_all(self) -> None:
        self.broker.admission.release(self, self.inflight)
        self.inflight = 0

    def get_buffer(self, sizehint: int) -> memoryview:
        frame = self._frame
        if frame is not None:
            if self._frame_pos == len(frame):
                frame = self._grow(frame)
            return memoryview(frame)[self._frame_pos :]
        return self._scratch_view[self._filled :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._frame is not None:
            self._frame_pos += nbytes
            if self._frame_pos == self._frame_size:
                frame, self._frame = self._frame, None
                self._frame_done()
                self._deliver(frame)
            return
        self._filled += nbytes
        self._split_scratch()

    def eof_received(self) -> bool | None:
        return None

    # -- framing ------------------------------------------------------------------------
    def _split_scratch(self) -> None:
        data, end, pos = self._scratch, self._filled, 0
        limit = self.broker.config.max_request_bytes
        if not self.session.authenticated:  # Kafka's sasl.server.max.receive.size
            limit = min(limit, PRE_AUTH_MAX_BYTES)
        while end - pos >= 4 and not self._closed:
            size = int.from_bytes(data[pos : pos + 4], "big", signed=True)
            if size < 0 or size > limit:
                log.warning("closing %s: frame size %d outside 0..%d", self.peer, size, limit)
                self.rec.closed_bad_input()
                self.close()
                return
            have = end - pos - 4
            if have >= size:  # one copy: out of the scratch buffer through a view
                self._deliver(bytearray(self._scratch_view[pos + 4 : pos + 4 + size]))
                pos += 4 + size
                continue
            if size <= SCRATCH - 4:  # it will fit: wait for the rest in the scratch
                break
            if not self.broker.admission.reserve_frame(self, size):
                self.waiting_for_memory = size  # the bytes stay in the scratch buffer
                self._stop_reading()
                break
            self._start_frame(size, self._scratch_view[pos + 4 : end])
            pos = end
            break
        rest = end - pos
        if rest and pos:
            data[:rest] = data[pos:end]
        self._filled = rest
        if self._frame is None:  # a partial frame in the scratch buffer has a deadline too
            if not rest:
                self._cancel_read_timer()
            elif pos or self._read_timer is None:  # a new partial frame
                self._arm_read_timer()

    def memory_granted(self) -> None:
        """The broker reserved the frame this connection waited for: start receiving it."""
        size, self.waiting_for_memory = self.waiting_for_memory, 0
        if self._closed or not size:
            return
        self._start_frame(size, self._scratch_view[4 : self._filled])
        self._filled = 0
        self._resume_reading()

    def _deliver(self, frame: bytearray) -> None:
        self._frames.append(frame)
        self.rec.arrived(len(frame))
        self.inflight += len(frame)
        self.broker.admission.acquire(self, len(frame))
        self._frames_ready.set()

    def pause(self) -> None:
        if not self._paused and self.transport is not None and not self._closed:
            self._paused = True
            self._apply_reading()

    def resume(self) -> None:
        if self._paused and self.transport is not None and not self._closed:
            self._paused = False
            self._apply_reading()

    def _stop_reading(self) -> None:
        self._apply_reading()

    def _resume_reading(self) -> None:
        self._apply_reading()

    def _reading_stopped(self) -> bool:
        return self._paused or bool(self.waiting_for_memory) or self._muted is not None

    def _mute(self, ms: int) -> None:
        """Neither read nor handle requests for ``ms`` (a client over its quota,
        KIP-219): requests it pipelined wait, as on a Kafka broker's muted channel."""
        loop = asyncio.get_running_loop()
        until = loop.time() + ms / 1000
        if self._muted is not None:
            if self._muted.when() >= until:
                return
            self._muted.cancel()
        self._muted = loop.call_at(until, self._unmute)
        self._unmuted.clear()
        self._apply_reading()

    def _unmute(self) -> None:
        self._muted = None
        self._unmuted.set()
        self._apply_reading()

    def _apply_reading(self) -> None:
        """Pause the transport while in-flight bytes or the frame budget say so."""
        if self.transport is None or self._closed:
            return
        if self._reading_stopped():
            if not self._transport_paused:
                self._transport_paused = True
                self.transport.pause_reading()
            self._cancel_read_timer()  # not the client's fault while we do not read
        else:
            if self._transport_paused:
                self._transport_paused = False
                self.transport.resume_reading()
            if self._partial() and self._read_timer is None:
                self._arm_read_timer()

    @property
    def paused(self) -> bool:
        return self._paused

    def close(self) -> None:
        if not self._closed and self.transport is not None:
            self._closed = True
            self.transport.close()

    # -- dispatch -----------------------------------------------------------------------
    async def _process_loop(self) -> None:
        try:
            await self._process()
        finally:
            if self._draining:
                self._release_all()

    async def _process(self) -> None:
        while not self._closed or (self._draining and self._frames):
            if not self._frames:
                self._frames_ready.clear()
                await self._frames_ready.wait()
                continue
            if not self._unmuted.is_set() and not self._draining:
                await self._unmuted.wait()  # throttled by a quota
                continue
            frame = self._frames.popleft()
            self._busy = True
            try:
                item = await self._dispatch(frame)
            except KafkaProtocolError as exc:  # the frame does not decode
                log.warning("closing %s: %s", self.peer, exc)
                self.rec.closed_bad_input()
                self.close()
                return
            except Exception:
                log.exception("closing %s: request failed", self.peer)
                self.close()
                return
            finally:
                self._busy = False
            if item is None or self._draining:
                continue
            self._out.append(item)
            self._out_ready.set()

    async def _dispatch(self, frame: bytearray) -> tuple[RequestHeader, Any, int] | None:
        size = len(frame)
        session = self.session
        if session.failed:  # the failure answer is on its way; then the connection closes
            self._answered(size)
            return None
        if session.raw_tokens:
            return await self._raw_token(frame)
        mv = memoryview(frame)
        hdr = parse_request_header(mv)
        self.rec.started(hdr)
        api = self.broker.routes.get(hdr.api_key)
        if not session.permits(hdr.api_key):
            why = "after its session expired" if session.authenticated else "unauthenticated"
            raise KafkaProtocolError(ErrorCode.ILLEGAL_SASL_STATE, f"API {hdr.api_key} {why}")
        if api is None:
            raise KafkaProtocolError(
                ErrorCode.INVALID_REQUEST, f"unknown API key {hdr.api_key} v{hdr.api_version}"
            )
        if not api.min_version <= hdr.api_version <= api.max_version:
            if hdr.api_key == ApiKey.API_VERSIONS:
                routes = self.broker.routes.values()
                keys = [(a.key, a.min_version, a.max_version) for a in routes]
                return hdr, Raw(api_versions_fallback(hdr.correlation_id, sorted(keys))), size
            raise KafkaProtocolError(
                ErrorCode.UNSUPPORTED_VERSION,
                f"API {hdr.api_key} v{hdr.api_version} is not supported",
            )
        body = mv[hdr.size :]
        if api.decode is not None:
            request = api.decode(body, hdr.api_version)
        else:
            request = decode_request(hdr.api_key, hdr.api_version, body)
        ctx = RequestContext(self.broker, hdr, self.peer, session)
        try:
            result = await api.handle(ctx, request)
        except UNAVAILABLE:
            raise  # closes the connection: clients reconnect and retry (see the module doc)
        except Exception as exc:  # a handler bug: answer, keep the connection
            handler_failed(hdr.api_key, hdr.api_version, exc)
            return hdr, error_response(hdr.api_key, ErrorCode.UNKNOWN_SERVER_ERROR), size
        if ctx.throttle_ms > 0:  # muted now, until throttle_ms after the response is sent
            self._mute_after[hdr.correlation_id] = ctx.throttle_ms
            self._mute(ctx.throttle_ms)
        if inspect.isawaitable(result):
            result = asyncio.ensure_future(self.rec.deferred(result))
        elif result is None:
            self.rec.finished(None, None)
            self._answered(size)
            if self._mute_after.pop(hdr.correlation_id, 0) > 0:  # acks=0: no response
                self._mute(ctx.throttle_ms)
            return None
        return hdr, result, size

    async def _raw_token(self, frame: bytearray) -> tuple[RequestHeader, Any, int] | None:
        """A bare SASL token after SaslHandshake v0; answered as a bare frame."""
        security = self.broker.security
        session = self.session
        res = await authenticate_step(
            session, security.credentials, security.jwt, bytes(frame), self.peer
        )
        if res.error is not None:
            raise KafkaProtocolError(ErrorCode.SASL_AUTHENTICATION_FAILED, res.error)
        if res.done:
            session.raw_tokens = False
        out = len(res.token).to_bytes(4, "big") + res.token
        return RequestHeader(ApiKey.SASL_AUTHENTICATE, 0, 0, None, 0), Raw([out]), len(frame)

    def _answered(self, size: int) -> None:
        self.inflight -= size
        self.broker.admission.release(self, size)
