"""Direct GETs of segment bytes for ``S3Store.get_buffer`` (docs/benchmarks.md, cold
reads; docs/operations.md, the ``direct_gets`` URL parameter).

The SDK path (aiobotocore over aiohttp) handles a response body on the event loop: every
chunk the socket yields becomes a ``bytes`` object, is queued, drained and finally joined,
all under the GIL (~0.75 ms of CPU per MB, a third of a cold read's). Here the request is
signed by the SDK as a presigned URL, sent by ``http.client`` from a small thread pool,
and the body is read with ``readinto`` straight into one preallocated buffer of the
announced length (the GIL released while the socket is read): ~0.45 ms per MB, off the
event loop.

Only the outcomes a read needs are decided here (200/206 with the body, 404, 412, 416);
anything else (a connection failure, a 5xx, a 403, a response that ignored the range)
returns ``None`` and the caller falls back to the SDK path, with its retries and errors.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import logging
import mmap
import socket
import ssl
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit

from segments.offload import Offloader

log = logging.getLogger(__name__)

THREADS = 8  # concurrent direct GETs per store (readahead: a few; fetch misses: a few)
TIMEOUT_S = 60.0  # per socket operation, as botocore's read timeout
MAP_MIN = 1 << 20  # bodies from this size on are read into an anonymous mapping
HUGE_PAGE = 2 << 20  # a transparent huge page (x86-64, arm64 with 4 KiB pages)
HUGE_MIN = HUGE_PAGE  # ... for bodies from this size on (a tail short of one: small pages)
PAGE = mmap.PAGESIZE
MADV_POPULATE_WRITE = 23  # Linux 5.14 (not in the mmap module of Python 3.11)
_HUGE = hasattr(mmap, "MADV_HUGEPAGE") and mmap.PAGESIZE == 4096


def _buffer(n: int) -> memoryview:
    """A writable buffer for a body of ``n`` bytes. From ``MAP_MIN`` on an anonymous
    mapping (``anonymous_buffer``): ``bytearray(n)`` zero-fills fresh pages with the GIL
    held, a fault per page (docs/benchmarks.md, Round 3 and Round 4: cold reads)."""
    if n < MAP_MIN:
        return memoryview(bytearray(n))
    return anonymous_buffer(n)


def anonymous_buffer(n: int) -> memoryview:
    """``n`` bytes of fresh anonymous memory for a body to be read into.

    Bodies of at least ``HUGE_MIN`` bytes start at a ``HUGE_PAGE`` boundary of a mapping
    advised ``MADV_HUGEPAGE``: the kernel backs them with 2 MiB pages where it can, so
    8 MiB come in four page faults instead of 2,048, taken inside the socket read (the GIL
    released). Micro-benchmark, allocation + copy of 8 MiB: 0.07 against 0.45-0.57 ms/MB
    (docs/benchmarks.md, Round 4: cold reads). The slack before the boundary is never
    touched (never resident); a tail short of a huge page gets ordinary pages. Smaller
    bodies, and kernels without the advice, get a mapping populated at once (one call,
    the GIL released, instead of a fault per page)."""
    if n < HUGE_MIN or not _HUGE:
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
        return memoryview(mmap.mmap(-1, n, flags=flags))
    m = mmap.mmap(-1, n + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    off = -_address(m) % HUGE_PAGE
    length = -(-n // PAGE) * PAGE
    try:
        m.madvise(mmap.MADV_HUGEPAGE, off, length)
    except OSError:  # ordinary pages, populated here (madvise holds the GIL: a small cost)
        with contextlib.suppress(OSError):  # before Linux 5.14: by the first write instead
            m.madvise(MADV_POPULATE_WRITE, off, length)
    # huge pages: no populating here; the body's read faults them in, a fault per 2 MiB,
    # with the GIL released (madvise holds it while the kernel zeroes the pages)
    return memoryview(m)[off : off + n]


def _address(m: mmap.mmap) -> int:
    """The address of ``m``'s first byte (the exported view is released at once)."""
    ref = ctypes.c_char.from_buffer(m)
    try:
        return ctypes.addressof(ref)
    finally:
        del ref


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: memoryview | None = None  # read-only, the whole body (200/206)


class DirectHTTP:
    """A thread pool whose threads each keep one kept-alive connection per endpoint
    (shared by the direct GETs here and the direct PUTs, segments/s3_direct_put.py)."""

    def __init__(self, ca_bundle: str | None, threads: int, name: str) -> None:
        self._pool = Offloader(threads, name)
        self._local = threading.local()
        self._ca_bundle = ca_bundle
        self._ssl: ssl.SSLContext | None = None
        self._conns: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _conn(self, scheme: str, host: str, port: int | None) -> http.client.HTTPConnection:
        conns: dict[tuple[str, str, int | None], http.client.HTTPConnection] | None
        conns = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        conn = conns.get((scheme, host, port))
        if conn is None:
            if scheme == "https":
                conn = http.client.HTTPSConnection(
                    host, port, timeout=TIMEOUT_S, context=self._context()
                )
            else:
                conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT_S)
            conns[(scheme, host, port)] = conn
            with self._lock:
                self._conns.append(conn)
        return conn

    def _drop(
        self, conn: http.client.HTTPConnection, scheme: str, host: str, port: int | None
    ) -> None:
        conn.close()
        getattr(self._local, "conns", {}).pop((scheme, host, port), None)
        with self._lock:
            if conn in self._conns:
                self._conns.remove(conn)

    def _context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context(cafile=self._ca_bundle)
        return self._ssl

    def close(self) -> None:
        self._pool.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:  # a GET still reading returns at once (an error, dropped)
            if conn.sock is not None:
                with contextlib.suppress(OSError):
                    conn.sock.shutdown(socket.SHUT_RDWR)
            conn.close()


class DirectGetter(DirectHTTP):
    def __init__(self, ca_bundle: str | None = None, threads: int = THREADS) -> None:
        super().__init__(ca_bundle, threads, "s3-get")

    async def get(
        self,
        url: str,
        headers: dict[str, str],
        expect: int | None,
        into: memoryview | None = None,
    ) -> Reply | None:
        """GET ``url`` (presigned) with ``headers``; ``expect``: the body length a ranged
        GET must return (a 200 with the whole object instead is refused); ``into``: read
        the body into this buffer (of ``expect`` bytes) instead of a new one. None: use the
        SDK path."""
        try:
            return await self._pool.run(self._get, url, headers, expect, into)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            log.debug("direct GET failed, falling back to the SDK: %s", exc)
            return None

    def _get(
        self, url: str, headers: dict[str, str], expect: int | None, into: memoryview | None
    ) -> Reply | None:
        parts = urlsplit(url)
        target = parts.path + ("?" + parts.query if parts.query else "")
        for attempt in (0, 1):  # a kept-alive connection the server closed: once more
            conn = self._conn(parts.scheme, parts.hostname or "", parts.port)
            try:
                conn.request("GET", target, headers=headers)
                resp = conn.getresponse()
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
                self._drop(conn, parts.scheme, parts.hostname or "", parts.port)
                if attempt:
                    raise
                continue
            try:
                return self._reply(resp, expect, into)
            except BaseException:
                self._drop(conn, parts.scheme, parts.hostname or "", parts.port)
                raise
        return None

    @staticmethod
    def _reply(
        resp: http.client.HTTPResponse, expect: int | None, into: memoryview | None
    ) -> Reply | None:
        status = resp.status
        length = resp.getheader("Content-Length")
        if status not in (200, 206) or length is None:
            resp.read()  # a small error document; the connection stays usable
            return Reply(status) if status in (404, 412, 416) else None
        n = int(length)
        if expect is not None and (status != 206 or n != expect):
            resp.read()
            return None
        view = _buffer(n) if into is None or len(into) != n else into
        pos = 0
        while pos < n:
            got = resp.readinto(view[pos:])
            if not got:
                raise http.client.IncompleteRead(bytes(0), n - pos)
            pos += got
        resp.read()  # the (empty) rest: the response is complete, the connection reusable
        return Reply(status, view if view is into else view.toreadonly())
