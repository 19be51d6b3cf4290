"""Many objects made durable together: ``LocalStore.put_many_if_absent``.

A flush cycle writes one object per partition it flushes. Through ``put_if_absent`` each
object costs a file ``fsync`` and a directory ``fsync`` of its own, so a cycle of a
broker with many active partitions costs ever more the more partitions it holds, in
kernel CPU above all (docs/benchmarks.md, "Round 5: many partitions"). A batch of at
least ``BATCH_MIN`` objects has two durability barriers in all instead:

1. every object's bytes go to a temp file beside its final name (as ``put_if_absent``),
   the batch split over up to ``WRITERS`` threads;
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
writers a barrier costs more (docs/operations.md, "Tuning"). Several writer threads,
not one: a thread making many short system calls waits for the GIL after each while the
event loop is busy, so one thread alone took the batch's tail latency to hundreds of ms.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from segments.store import ObjectExistsError, PutItem, StoreError

if TYPE_CHECKING:
    from segments.local_files import TmpObject
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
    parts: list[Written] = []  # every temp file written: closed and removed at the end
    try:
        parts = list(
            await asyncio.gather(
                *(asyncio.to_thread(_write, store, items, r, results) for r in _chunks(len(items)))
            )
        )
        if not await _barrier(root, parts, results, "objects not written"):
            return results
        linked = list(await asyncio.gather(*(asyncio.to_thread(_link, p, results) for p in parts)))
        if not await _barrier(root, linked, results, "names not durable"):
            return results
        for part in linked:
            for i, obj in part:
                store._remember(obj.st, obj.etag)
                results[i] = obj.etag
        return results
    finally:
        await asyncio.to_thread(_close, store, parts, root)


async def _barrier(root: int, parts: list[Written], results: list[Result], what: str) -> bool:
    """One syncfs; when it fails every object of ``parts`` fails (False)."""
    try:
        await asyncio.to_thread(_syncfs, root)
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
