"""Many objects made durable together: ``LocalStore.put_many_if_absent``.

A flush cycle writes one object per partition it flushes. Through ``put_if_absent`` each
object costs a file ``fsync`` and a directory ``fsync`` of its own, so a cycle of a
broker with many active partitions costs ever more the more partitions it holds, in
kernel CPU above all (docs/benchmarks.md, "Round 5: many partitions"). A batch of at
least ``BATCH_MIN`` objects has two durability barriers in all instead:

1. every object's bytes go to a temp file beside its final name (as ``put_if_absent``);
2. one ``syncfs(2)`` of the store's file system: every temp file's bytes are durable;
3. every temp file is hard-linked to its final name (``link`` fails if the name exists:
   that object alone gets ``ObjectExistsError``) and unlinked, in the same threads;
4. a second ``syncfs``: every new name is durable.

Each object gets the guarantees ``put_if_absent`` gives: its bytes are durable before
its name points at them, its name is durable before the call returns, and a crash leaves
at most stray temp files. ``syncfs`` reports writeback errors since Linux 5.8 (sampled
from a file descriptor of the store's root opened before the batch writes anything); a
failed barrier fails every object of the batch (a name already linked is then the
caller's to delete, as after any failed PUT).

Smaller batches, a kernel before 5.8 or without ``syncfs``, and ``file://DIR?syncfs=false``
take concurrent ``put_if_absent`` calls: ``syncfs`` writes back every dirty page of the
file system, not only the batch's, so on a data directory shared with other heavy
writers a barrier costs more (docs/operations.md, "Tuning").

Steps 1 and 3 (and closing the temp files) are each one call of ``segments/_localio.c``
that releases the GIL for the whole batch, and the batch makes two hops to a thread in
all: steps 1 and 2, then steps 3 and 4 and the closing. A thread making the batch's ~8
system calls per object from Python waits for the GIL after each one while the event
loop is busy, and that took the batch's tail latency to hundreds of ms; without the
extension (or with ``direct_io``) the Python steps run in up to ``WRITERS`` threads,
which shortens that wait but does not remove it (docs/benchmarks.md, "Round 5: many
partitions").
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import logging
import os
import sys
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import crc32c as _crc32c

from segments.local_files import TMP_MARKER, TmpObject, crc_etag
from segments.offload import to_thread
from segments.store import ObjectExistsError, PutItem, StoreError

try:  # the phases without the GIL (segments/_localio.c); optional
    from segments import _localio  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - a build without the extension
    _localio = None

if TYPE_CHECKING:
    from segments.local_store import LocalStore

log = logging.getLogger(__name__)

BATCH_MIN = 8  # fewer objects: concurrent put_if_absent calls (their fsyncs overlap)
WRITERS = 4  # threads writing and linking one batch
GROUP = 256  # objects per barrier pair: bounds the temp files held open

Result = str | StoreError
Written = list[tuple[int, "TmpObject"]]


def _load_syncfs() -> Callable[[int], int] | None:
    """libc's ``syncfs`` when it reports writeback errors (Linux 5.8+), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    except ValueError:
        return None
    if (major, minor) < (5, 8):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_SYNCFS = _load_syncfs()


def batches(store: LocalStore, n: int) -> bool:
    """Whether ``n`` objects go to the store as one batch with two barriers."""
    return n >= BATCH_MIN and store.syncfs and _SYNCFS is not None


def _syncfs(fd: int) -> None:
    fn = _SYNCFS
    if fn is None or fn(fd) != 0:
        err = ctypes.get_errno() if fn is not None else 0
        raise OSError(err, f"syncfs: {os.strerror(err)}")


async def put_batch(store: LocalStore, items: Sequence[PutItem]) -> list[Result]:
    """Per item, its ETag or the error ``put_if_absent`` would have raised."""
    out: list[Result] = []
    for lo in range(0, len(items), GROUP):
        out += await _group(store, items[lo : lo + GROUP])
    return out


def _chunks(n: int) -> list[range]:
    step = -(-n // min(WRITERS, n))
    return [range(lo, min(n, lo + step)) for lo in range(0, n, step)]


async def _group(store: LocalStore, items: Sequence[PutItem]) -> list[Result]:
    results: list[Result] = [StoreError("not written")] * len(items)
    root = os.open(store.root, os.O_RDONLY | os.O_DIRECTORY)  # before any write: errseq
    if _localio is not None and not store.direct_io:
        return await _group_native(store, items, results, root)
    parts: list[Written] = []  # every temp file written: closed and removed at the end
    try:
        parts = list(
            await asyncio.gather(
                *(to_thread(_write, store, items, r, results) for r in _chunks(len(items)))
            )
        )
        if not await to_thread(_sync, root, parts, results, "objects not written"):
            return results
        linked = list(await asyncio.gather(*(to_thread(_link, p, results) for p in parts)))
        if not await to_thread(_sync, root, linked, results, "names not durable"):
            return results
        _done(store, linked, results)
        return results
    finally:
        await to_thread(_close, store, parts, root)


async def _group_native(
    store: LocalStore, items: Sequence[PutItem], results: list[Result], root: int
) -> list[Result]:
    """The batch in two hops to a thread: write and barrier, then link, barrier and
    close (five before: about 3 x 28 us of CPU saved per batch; docs/benchmarks.md,
    "Round 18")."""
    batch = _NativeBatch(store, root)
    try:
        if not await to_thread(batch.write_synced, items, results):
            return results
        linked = await to_thread(batch.link_synced, results)
        if linked is not None:
            _done(store, linked, results)
        return results
    finally:
        if not batch.closed:  # cancelled, or a step raised: close once, after the step
            await to_thread(batch.close)


def _done(store: LocalStore, linked: list[Written], results: list[Result]) -> None:
    for part in linked:
        for i, obj in part:
            store._remember_key(obj.stat_key, obj.etag)
            results[i] = obj.etag


class _NativeBatch:
    """The temp files of one batch through ``segments/_localio.c``. A step holds the lock
    for its whole length, so a ``close`` after a cancelled awaiter waits for the step a
    thread is still running, and the files are closed exactly once."""

    def __init__(self, store: LocalStore, root: int) -> None:
        self.store = store
        self.root = root
        self.written: Written = []
        self.closed = False
        self._lock = threading.Lock()

    def write_synced(self, items: Sequence[PutItem], results: list[Result]) -> bool:
        """Write the temp files, then the first barrier (thread)."""
        with self._lock:
            self.written = _write_native(self.store, items, results)
            return _sync(self.root, [self.written], results, "objects not written")

    def link_synced(self, results: list[Result]) -> list[Written] | None:
        """Link the final names, the second barrier, then close (thread): the linked
        objects, or None when the barrier failed."""
        with self._lock:
            try:
                linked = _link_native(self.written, results)
                ok = _sync(self.root, [linked], results, "names not durable")
                return [linked] if ok else None
            finally:
                self._close()

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if not self.closed:
            self.closed = True
            _close_native(self.store, [self.written], self.root)


def _write_native(store: LocalStore, items: Sequence[PutItem], results: list[Result]) -> Written:
    """Temp files of ``items`` in one call without the GIL (thread); directories, paths
    and ETags prepared here. A name that exists is found by its link, not checked first."""
    todo: list[tuple[int, str, str, str, str]] = []  # index, final, directory, tmp, etag
    datas: list[bytes | memoryview] = []
    tag = uuid.uuid4().hex
    for i, item in enumerate(items):
        try:
            final = store._path(item.key)
            directory, name = os.path.split(final)
            store._known_dir(directory)
        except (OSError, ValueError) as exc:
            results[i] = StoreError(f"put {item.key}: {exc}")
            continue
        data = item.data[0] if len(item.data) == 1 else b"".join(item.data)
        view = memoryview(data)
        crc = item.crc32c if item.crc32c is not None else _crc32c.crc32c(view)
        tmp = os.path.join(directory, f".{name}{TMP_MARKER}{tag}{i:x}")
        todo.append((i, final, directory, tmp, crc_etag(crc, view.nbytes)))
        datas.append(view)
    assert _localio is not None
    out = _localio.write_new([os.fsencode(t[3]) for t in todo], datas, [t[4] for t in todo])
    written: Written = []
    for (i, final, directory, tmp, etag), res in zip(todo, out, strict=True):
        if isinstance(res, int):
            if res == errno.ENOENT:  # its directory went away: made again next time
                store._dirs.discard(directory)
            results[i] = StoreError(f"put {items[i].key}: {os.strerror(res)}")
            continue
        fd, dev, ino, mtime_ns, size = res
        written.append(
            (
                i,
                TmpObject(
                    items[i].key, final, directory, tmp, fd, (dev, ino, mtime_ns, size), etag
                ),
            )
        )
    return written


def _link_native(written: Written, results: list[Result]) -> Written:
    """``_link`` in one call without the GIL (thread)."""
    assert _localio is not None
    errs = _localio.link_all(
        [os.fsencode(o.tmp) for _i, o in written], [os.fsencode(o.final) for _i, o in written]
    )
    linked: Written = []
    for (i, obj), err in zip(written, errs, strict=True):
        if err == 0:
            linked.append((i, obj))
        elif err == errno.EEXIST:
            results[i] = ObjectExistsError(obj.key)
        else:
            results[i] = StoreError(f"put {obj.key}: {os.strerror(err)}")
    return linked


def _close_native(store: LocalStore, parts: list[Written], root: int) -> None:
    """``_close`` in one call without the GIL (thread)."""
    assert _localio is not None
    objs = [obj for part in parts for _i, obj in part]
    _localio.close_all([o.fd for o in objs], [os.fsencode(o.tmp) for o in objs], store.drop_cache)
    os.close(root)


def _sync(root: int, parts: list[Written], results: list[Result], what: str) -> bool:
    """One syncfs (thread); when it fails every object of ``parts`` fails (False)."""
    try:
        _syncfs(root)
        return True
    except OSError as exc:
        n = sum(len(p) for p in parts)
        log.warning("object store barrier failed, %d %s: %s", n, what, exc)
        for part in parts:
            for i, obj in part:
                results[i] = StoreError(f"put {obj.key}: {exc}")
        return False


def _write(
    store: LocalStore, items: Sequence[PutItem], idx: range, results: list[Result]
) -> Written:
    """Temp files of ``items[idx]`` (thread); an item that cannot be written gets its error."""
    written: Written = []
    for i in idx:
        item = items[i]
        try:
            written.append((i, store._write_tmp(item.key, item.data, item.crc32c)))
        except StoreError as exc:
            results[i] = exc
        except (OSError, ValueError) as exc:
            results[i] = StoreError(f"put {item.key}: {exc}")
    return written


def _link(written: Written, results: list[Result]) -> Written:
    """Give each durable temp file its final name (exclusive; thread)."""
    linked: Written = []
    for i, obj in written:
        try:
            os.link(obj.tmp, obj.final)
        except FileExistsError:
            results[i] = ObjectExistsError(obj.key)
            continue
        except OSError as exc:
            results[i] = StoreError(f"put {obj.key}: {exc}")
            continue
        linked.append((i, obj))
    return linked


def _close(store: LocalStore, parts: list[Written], root: int) -> None:
    """Close every temp file (its clean pages dropped first, as ``put_if_absent`` does)
    and remove its temp name (thread)."""
    for part in parts:
        for _i, obj in part:
            if store.drop_cache:
                try:
                    os.posix_fadvise(obj.fd, 0, 0, os.POSIX_FADV_DONTNEED)
                except OSError:
                    pass
            os.close(obj.fd)
            try:
                os.unlink(obj.tmp)
            except FileNotFoundError:
                pass
    os.close(root)
