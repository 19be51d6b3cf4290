"""Writing a new object file with ``O_DIRECT`` (``LocalStore.put_if_absent``: every object
with ``file://DIR?direct_io=true``, else PUTs of at least ``DIRECT_MIN_BYTES`` that are
not paced).

Every object the broker writes is fsynced at once and read back, if at all, through the
broker's own segment cache, so the page cache only costs: on the project's VM a buffered
``write`` of a new file took 0.5-3.4 ms of system CPU per MB (page allocation, memcg
charging, copying; then writeback at ``fsync``), ``O_DIRECT`` from an aligned buffer
0.2-0.3 ms plus one ``memcpy`` into that buffer (docs/benchmarks.md), made without the
GIL where ``segments/_localio.c`` is built. The parts are copied into a page-aligned
buffer (pooled; ``CHUNK`` bytes at a time, so that the buffers stay small), padded to a
multiple of ``ALIGN``, written, and the file is truncated to its real size before the
caller's ``fsync``.

A filesystem without ``O_DIRECT`` (``EINVAL`` at open or at the first write, e.g. some
tmpfs or FUSE mounts) makes ``write_direct`` return None before anything is left
behind; the caller then writes through the page cache as before.

Why not every object by default: the ``write`` waits for the disk. For a flush cycle's
small PUTs (idempotent producers' 1 MB batches, the Java client's 16 KiB ones) and for
merges that cost more CPU and latency than the page cache's copy (docs/benchmarks.md,
"Round 25"); for large PUTs (plain produce at full speed) it saves ~15 % of the broker's
CPU per MB.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from collections.abc import Iterator, Sequence

import crc32c as _crc32c

from segments.store import Buffer

try:  # copies without the GIL (segments/_localio.c); optional
    from segments import _localio  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - a build without the extension
    _localio = None

ALIGN = 4096  # covers 512- and 4096-byte logical blocks; mmap buffers are page aligned
CHUNK = 4 << 20  # bytes copied into the aligned buffer and written at a time
_POOL_KEEP = 2  # buffers kept for reuse (one per concurrent PUT of a flush cycle)
_GRAIN = 1 << 20


class _Pool:
    """A few page-aligned anonymous mappings, reused so that their pages stay faulted in."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: list[mmap.mmap] = []

    def take(self, size: int) -> mmap.mmap:
        with self._lock:
            for i, buf in enumerate(self._free):
                if len(buf) >= size:
                    return self._free.pop(i)
        size = max(_GRAIN, -(-size // _GRAIN) * _GRAIN)
        # private: a shared anonymous mapping is shmem, whose page faults cost more
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)

    def give(self, buf: mmap.mmap) -> None:
        with self._lock:
            if len(buf) <= CHUNK and len(self._free) < _POOL_KEEP:
                self._free.append(buf)
                return
        buf.close()


_pool = _Pool()


def _unsupported(exc: OSError) -> bool:
    return exc.errno in (errno.EINVAL, errno.EOPNOTSUPP)


def _pieces(data: Sequence[Buffer], step: int) -> Iterator[tuple[list[memoryview], int]]:
    """The concatenation of ``data`` in pieces of ``step`` bytes (the last one shorter):
    each as the slices of the parts it spans and its length, the parts walked once."""
    parts: list[memoryview] = []
    n = 0
    for part in data:
        m = memoryview(part).cast("B")
        while m.nbytes:
            take = min(step - n, m.nbytes)
            parts.append(m[:take])
            n += take
            m = m[take:]
            if n == step:
                yield parts, n
                parts, n = [], 0
    if n:
        yield parts, n


def _fill(view: memoryview, parts: list[memoryview]) -> None:
    """``parts`` one after the other at the start of ``view``: copied without the GIL
    where the extension is built."""
    if _localio is not None:
        _localio.copy_into(view, parts)
        return
    at = 0
    for m in parts:
        view[at : at + m.nbytes] = m
        at += m.nbytes


def write_direct(
    path: str, data: Sequence[Buffer], crc: int | None = None, piece: int | None = None
) -> tuple[int, int] | None:
    """Create ``path`` (exclusive) holding the concatenation of ``data``, written with
    ``O_DIRECT`` and not yet fsynced. Returns (CRC-32C, size), or None where the
    filesystem does not take ``O_DIRECT`` (nothing is left at ``path`` then). A ``crc``
    given (the caller's, ``LocalStore.put_if_absent``) is returned as is, not computed.
    ``piece`` (a multiple of ``ALIGN``): written ``piece`` bytes per ``write``. Each one
    returns when the disk has taken it, so a background writer's object never fills the
    disk's queue ahead of a flush cycle's PUT (``LocalStore.put_paced_if_absent``)."""
    size = sum(memoryview(b).nbytes for b in data)
    padded = -(-size // ALIGN) * ALIGN
    if padded == 0:
        return None  # an empty object: nothing to gain
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o644)
    except OSError as exc:
        if _unsupported(exc):
            return None
        raise
    step = min(CHUNK if piece is None else piece, padded)
    buf = _pool.take(step)
    ok = False
    try:
        if crc is None:
            crc = 0
            for part in data:
                crc = _crc32c.crc32c(part, crc)
        view = memoryview(buf)
        try:
            if not _write_chunks(fd, view, data, step):
                return None
        finally:
            view.release()
        os.ftruncate(fd, size)  # the last chunk's pad cut off
        ok = True
        return crc, size
    finally:
        _pool.give(buf)
        os.close(fd)
        if not ok:
            os.unlink(path)


def _write_chunks(fd: int, view: memoryview, data: Sequence[Buffer], step: int) -> bool:
    """``data`` through ``view`` (``step`` bytes, aligned), ``step`` bytes per ``write``;
    False when the file system refuses the first ``O_DIRECT`` write."""
    first = True
    for parts, n in _pieces(data, step):
        _fill(view, parts)
        m = -(-n // ALIGN) * ALIGN
        view[n:m] = bytes(m - n)  # the pad, cut off by the caller
        written = 0
        while written < m:
            try:
                written += os.write(fd, view[written:m])
            except OSError as exc:
                if first and written == 0 and _unsupported(exc):
                    return False
                raise
        first = False
    return True
