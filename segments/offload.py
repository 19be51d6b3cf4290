"""Blocking calls off the event loop, at a third of ``asyncio.to_thread``'s cost
(docs/benchmarks.md, "Round 17").

A hop to a thread and back through ``asyncio.to_thread`` (or ``run_in_executor``) cost
about 100 us of CPU on this project's 2-core VMs, against 28 us here: the executor's
Python-level idle semaphore, a ``concurrent.futures.Future`` with its condition variable
and the asyncio future chained to it all run under the GIL, on both sides of the hop.
At many partitions a broker makes a thousand hops a second and more (each flush cycle's
PUT and metadata append, each merge's), and ``ThreadPoolExecutor.submit`` was the top
function of its profile. ``Offloader.run`` puts (loop, future, call) on one
``queue.SimpleQueue`` read by its threads, and a thread answers with
``loop.call_soon_threadsafe``.

Otherwise it behaves as ``to_thread``: a call whose awaiter is cancelled before a thread
takes it is not run, one already running runs to its end (its result dropped), and its
exception is raised in the awaiter. Context
variables are not copied into the thread (no caller uses them there). Threads start at
the first call in a process (a forked child starts its own) and are daemons; ``close``
cancels what has not started and stops them.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_Item = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]


def _settle(fut: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if fut.done():  # cancelled meanwhile: the result is dropped
        return
    if exc is None:
        fut.set_result(result)
    elif isinstance(exc, StopIteration):  # a future cannot hold one
        fut.set_exception(RuntimeError(f"{type(exc).__name__} raised in a thread"))
    else:
        fut.set_exception(exc)


def _serve(q: queue.SimpleQueue[_Item | None]) -> None:
    """A worker thread: run what comes from ``q`` until a None. It holds the queue, not
    the ``Offloader``, so that an offloader nobody closed can still be collected (its
    finalizer then stops its threads)."""
    while True:
        item = q.get()
        if item is None:
            return
        loop, fut, fn, args = item
        del item
        if fut.cancelled():  # its awaiter was cancelled before it started
            continue
        try:
            result, exc = fn(*args), None
        except BaseException as e:  # handed to the awaiter, as to_thread does
            result, exc = None, e
        try:
            loop.call_soon_threadsafe(_settle, fut, result, exc)
        except RuntimeError:  # the loop is closed: nobody awaits it any more
            pass
        del fut, fn, args, result, exc


def _stop(q: queue.SimpleQueue[_Item | None], threads: int) -> None:
    for _ in range(threads):
        q.put(None)


class Offloader:
    """``threads`` worker threads named ``name-N``, started at the first ``run``."""

    def __init__(self, threads: int, name: str) -> None:
        if threads < 1:
            raise ValueError("an offloader needs at least one thread")
        self.threads = threads
        self.name = name
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._pid = 0  # the process whose threads serve the queue
        self._lock = threading.Lock()
        self._closed = False
        self._stop: weakref.finalize[..., Offloader] | None = None

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """``fn(*args)`` in one of the threads; a future of the running loop for its
        result. Raises RuntimeError once closed."""
        if self._closed:
            raise RuntimeError(f"offloader {self.name} is closed")
        if self._pid != os.getpid():
            self._start()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._queue.put((loop, fut, fn, args))
        return fut

    def _start(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                return
            if self._pid:  # a forked child: the parent's threads are not here
                self._queue = queue.SimpleQueue()
            for i in range(self.threads):
                threading.Thread(
                    target=_serve, args=(self._queue,), name=f"{self.name}-{i}", daemon=True
                ).start()
            self._pid = os.getpid()
            self._stop = weakref.finalize(self, _stop, self._queue, self.threads)

    def close(self) -> None:
        """Cancel the calls not started yet and stop the threads (a call running ends
        first, its result dropped if its awaiter is gone)."""
        self._closed = True
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                loop, fut = item[0], item[1]
                try:
                    loop.call_soon_threadsafe(fut.cancel)
                except RuntimeError:
                    pass
        if self._stop is not None and self._pid == os.getpid():
            self._stop()  # once: a finalizer runs at most once


#: the stores' and the broker's blocking calls (file I/O, joins of large buffers): as
#: many threads as asyncio's default executor has
DEFAULT = Offloader(min(32, (os.cpu_count() or 1) + 4), "offload")


def to_thread(fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """``asyncio.to_thread`` through ``DEFAULT``."""
    return DEFAULT.run(fn, *args)
