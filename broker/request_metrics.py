"""Per-request metrics: the one hook ``broker.connection`` calls (docs/operations.md,
"Metrics").

A :class:`RequestRecorder` per listener owns the families; each connection gets a
:class:`ConnectionRecorder` from it (``recorder.connection()``) and tells it, in order:
a frame arrived (``arrived``), its request started (``started``), the handler returned a
deferred response (``deferred`` wraps it: its completion ends the wait on the flush and
commit), and the response went out (``finished``). Responses leave in request
order, so the per-connection queue of started requests needs no ids. Times come from
``time.perf_counter``; with ``enabled=False`` (``BrokerConfig.request_metrics``, an
internal switch for bench/obs.py to measure their cost) only connections are counted.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from collections.abc import Awaitable, Mapping
from typing import Any

from broker.handlers.registry import Encoded
from broker.log_metrics import WAIT_BUCKETS
from broker.telemetry import SIZE_BUCKETS, Hist, Telemetry
from protocol.apis import ApiKey, api_name
from protocol.errors import ErrorCode
from protocol.frame import RequestHeader

_now = time.perf_counter

#: one (API, version)'s histograms: total, queued, commit wait, request size, response
#: size, the API's name, and (Produce only) the same total and commit wait in fine buckets
#: plus the total counted once per byte of the request
Children = tuple[Hist, Hist, Hist, Hist, Hist, str, tuple[Hist, Hist, Hist] | None]


class RequestRecorder:
    """The request families of one broker; ``listener`` labels its connections."""

    def __init__(
        self,
        telemetry: Telemetry,
        listener: str = "plaintext",
        enabled: bool = True,
        routes: Mapping[int, Any] | None = None,
    ) -> None:
        self.listener = listener
        self.enabled = enabled
        # the served (key, versions): anything else (a hostile client's made-up key or
        # version) is counted under one api="unknown" child, so labels stay bounded
        self.routes = routes
        t = telemetry
        self.total = t.histogram(
            "request_duration_seconds",
            "Time from a request's last byte read to its response written, by API and version.",
            ("api", "version"),
        )
        self.queued = t.histogram(
            "request_queue_seconds",
            "Time a request waited behind the connection's earlier requests before its "
            "handler started.",
            ("api", "version"),
        )
        self.commit_wait = t.histogram(
            "request_commit_wait_seconds",
            "Time a deferred response (Produce) waited on its flush and commit.",
            ("api", "version"),
        )
        # Produce's total and commit wait again, in the fine buckets of the flush's own
        # histograms (broker/log_metrics.py): the bench sets the broker's p99 beside the
        # client's and the flush budget (docs/benchmarks.md, "Round 4: paced p99")
        self.produce_fine = (
            t.histogram(
                "produce_request_duration_seconds",
                "Produce: time from the request's last byte read to its response written "
                "(fine buckets).",
                (),
                WAIT_BUCKETS,
            ).child(),
            t.histogram(
                "produce_commit_wait_seconds",
                "Produce: time its deferred response waited on the flush and commit "
                "(fine buckets).",
                (),
                WAIT_BUCKETS,
            ).child(),
            # a client's latency is per message, the request's per request: a slow request
            # carries the messages that piled up behind it. Counted per byte of the request
            # frame (fixed-size records: about per record), it compares with the client's
            t.histogram(
                "produce_byte_duration_seconds",
                "Produce: the request duration (as produce_request_duration_seconds) counted "
                "once per byte of the request frame.",
                (),
                WAIT_BUCKETS,
            ).child(),
        )
        self.request_size = t.histogram(
            "request_size_bytes", "Request frame sizes, by API.", ("api",), SIZE_BUCKETS
        )
        self.response_size = t.histogram(
            "response_size_bytes", "Response frame sizes, by API.", ("api",), SIZE_BUCKETS
        )
        self.responses = t.counter(
            "responses",
            "Error codes in responses, by API (top level and per partition; NONE counted).",
            ("api", "error"),
        )
        self.open = t.gauge("listener_connections", "Open client connections.", ("listener",))
        self.opened = t.counter("connections_opened", "Client connections accepted.", ("listener",))
        self.bad_input = t.counter(
            "connections_closed_bad_input",
            "Connections closed because a frame was malformed, oversized or undecodable.",
            ("listener",),
        )
        self.open.set((listener,), 0)
        self.bad_input.inc((listener,), 0)
        self._children: dict[tuple[int, int], Children] = {}
        self._codes: dict[str, dict[int, int]] = {}
        self.responses.before_collect = self._fill_responses

    def connection(self) -> ConnectionRecorder:
        return ConnectionRecorder(self)

    def children(self, key: int, version: int) -> Children:
        c = self._children.get((key, version))
        if c is None:
            route = self.routes.get(key) if self.routes is not None else None
            if self.routes is not None and (
                route is None or not route.min_version <= version <= route.max_version
            ):
                key, version = -1, -1
                c = self._children.get((key, version))
                if c is not None:
                    return c
            name = request_name(key) if key >= 0 else "unknown"
            v = str(version)
            c = self._children[(key, version)] = (
                self.total.child(name, v),
                self.queued.child(name, v),
                self.commit_wait.child(name, v),
                self.request_size.child(name),
                self.response_size.child(name),
                name,
                self.produce_fine if key == ApiKey.PRODUCE else None,
            )
        return c

    def count_errors(self, api: str, response: Any) -> None:
        """Count the response's error codes (per API: code -> count, turned into the
        ``responses`` family at scrape time)."""
        counts = self._codes.get(api)
        if counts is None:
            counts = self._codes[api] = {}
        if isinstance(response, Encoded):  # the fast paths: Produce, Fetch
            src = response.source
            if src is None:
                return
            if isinstance(src, list):
                topics = src
            else:
                topics = src.topics
                top = src.error_code
                counts[top] = counts.get(top, 0) + 1
            for t in topics:
                for p in t.partitions:
                    c = p.error_code
                    counts[c] = counts.get(c, 0) + 1
            return
        for code in error_codes(response):
            counts[code] = counts.get(code, 0) + 1

    def _fill_responses(self) -> None:
        for api, counts in self._codes.items():
            for code, n in counts.items():
                self.responses.set((api, _code_name(code)), n)


def request_name(key: int) -> str:
    """Kafka's request name for an API key (``ApiVersions``, ``Produce``), the ``api`` label
    (as in Kafka's RequestMetrics)."""
    return "".join(w.capitalize() for w in api_name(key).split("_"))


class ConnectionRecorder:
    """One connection's side of the hook (see the module doc)."""

    __slots__ = ("_arrived", "_started", "rec")

    def __init__(self, rec: RequestRecorder) -> None:
        self.rec = rec
        self._arrived: deque[tuple[float, int]] = deque()  # (arrival time, frame size)
        # (arrival, histograms, frame size)
        self._started: deque[tuple[float, Children, int]] = deque()

    def opened(self) -> None:
        rec = self.rec
        rec.opened.inc((rec.listener,))
        rec.open.inc((rec.listener,))

    def closed(self) -> None:
        self.rec.open.inc((self.rec.listener,), -1)

    def closed_bad_input(self) -> None:
        self.rec.bad_input.inc((self.rec.listener,))

    def arrived(self, size: int) -> None:
        if self.rec.enabled:
            self._arrived.append((_now(), size))

    def started(self, hdr: RequestHeader) -> None:
        if not self.rec.enabled or not self._arrived:
            return
        arrived, size = self._arrived.popleft()
        c = self.rec.children(hdr.api_key, hdr.api_version)
        c[1].observe(_now() - arrived)
        c[3].observe(size)
        self._started.append((arrived, c, size))

    def deferred(self, response: Awaitable[Any]) -> Awaitable[Any]:
        """``response`` is the deferred response of the request started last: returned
        wrapped so that its completion is timed (a coroutine frame around it, cheaper than
        a done callback, which costs a loop handle per response)."""
        if not self.rec.enabled or not self._started:
            return response
        c = self._started[-1][1]
        return _timed(response, c[2], c[6][1] if c[6] is not None else None)

    def finished(self, response: Any, buffers: list[Any] | None) -> None:
        """The response of the oldest started request went out (``buffers`` None: no
        response, an acks=0 Produce)."""
        if not self._started:
            return
        arrived, c, size = self._started.popleft()
        took = _now() - arrived
        c[0].observe(took)
        if c[6] is not None:
            c[6][0].observe(took)
            per_byte = c[6][2]
            per_byte.counts[bisect_left(per_byte.bounds, took)] += size
            per_byte.sum += took * size
        if buffers:  # bytes, bytearrays and byte-format memoryviews: len() is the size
            c[4].observe(sum(map(len, buffers)))
            self.rec.count_errors(c[5], response)


async def _timed(response: Awaitable[Any], hist: Hist, fine: Hist | None = None) -> Any:
    begun = _now()
    try:
        return await response
    finally:
        took = _now() - begun
        hist.observe(took)
        if fine is not None:
            fine.observe(took)


# -- error codes in responses ---------------------------------------------------------------
_CODE_NAMES: dict[int, str] = {}
_PLANS: dict[type, Any] = {}


def _code_name(code: int) -> str:
    name = _CODE_NAMES.get(code)
    if name is None:
        try:
            name = ErrorCode(code).name
        except ValueError:
            name = str(code)
        _CODE_NAMES[code] = name
    return name


def error_codes(response: Any) -> list[int]:
    """Every ``error_code`` in a response: the handler's list for fast-path (``Encoded``)
    responses, otherwise found by walking the message's schema (planned once per class)."""
    out: list[int] = []
    if isinstance(response, Encoded):
        _walk_source(response.source, out)
        return out
    struct = getattr(type(response), "_struct", None)
    if struct is None:
        return []
    plan = _PLANS.get(type(response))
    if plan is None:
        plan = _PLANS[type(response)] = _plan(struct._fields)
    _walk(response, plan, out)
    return out


def _walk_source(obj: Any, out: list[int]) -> None:
    """Error codes of a fast-path response's source: the dataclasses of
    ``protocol.fetch_fast`` / ``protocol.produce_fast`` (or a list of them)."""
    if isinstance(obj, list | tuple):
        for item in obj:
            _walk_source(item, out)
        return
    code = getattr(obj, "error_code", None)
    if code is not None:
        out.append(int(code))
    for name in ("topics", "partitions"):
        sub = getattr(obj, name, None)
        if sub is not None:
            _walk_source(sub, out)


def _plan(fields: Any) -> list[tuple[str, Any]]:
    """(attribute, sub-plan or None for the error code itself) for the fields that hold
    error codes, directly or below."""
    plan: list[tuple[str, Any]] = []
    for f in fields:
        sub = getattr(f, "_fields", None)
        if f.name == "error_code" and sub is None:
            plan.append((f.name, None))
        elif sub is not None:
            inner = _plan(sub)
            if inner:
                plan.append((f.name, inner))
    return plan


def _walk(obj: Any, plan: list[tuple[str, Any]], out: list[int]) -> None:
    for name, sub in plan:
        value = getattr(obj, name, None)
        if value is None:
            continue
        if sub is None:
            out.append(int(value))
        elif isinstance(value, list | tuple):
            for item in value:
                _walk(item, sub, out)
        else:
            _walk(value, sub, out)
