"""segments.offload.Offloader: blocking calls in its threads, answered on the caller's
event loop, with asyncio.to_thread's semantics for results, errors and cancellation."""

from __future__ import annotations

import asyncio
import gc
import threading

import pytest

from segments.offload import Offloader


async def test_a_call_returns_its_result_from_another_thread() -> None:
    off = Offloader(2, "t-result")
    try:
        name = await off.run(lambda: threading.current_thread().name)
        assert name.startswith("t-result-") and name != threading.current_thread().name
        assert await off.run(sum, [1, 2, 3]) == 6
    finally:
        off.close()


async def test_an_error_is_raised_in_the_awaiter() -> None:
    off = Offloader(1, "t-error")
    try:
        with pytest.raises(ZeroDivisionError):
            await off.run(lambda: 1 // 0)

        def stop() -> None:
            raise StopIteration

        with pytest.raises(RuntimeError, match="StopIteration"):
            await off.run(stop)  # a future cannot hold a StopIteration
        assert await off.run(int, "7") == 7  # the thread survived both
    finally:
        off.close()


async def test_the_threads_run_calls_side_by_side() -> None:
    off = Offloader(3, "t-parallel")
    barrier = threading.Barrier(3, timeout=60)
    try:
        assert await asyncio.gather(*(off.run(barrier.wait) for _ in range(3))) is not None
    finally:
        off.close()


async def test_cancelled_before_it_starts_it_does_not_run_started_it_runs_to_its_end() -> None:
    off = Offloader(1, "t-cancel")
    release, started = threading.Event(), threading.Event()
    ran: list[str] = []

    def blocker() -> str:
        started.set()
        release.wait(60)
        ran.append("blocker")
        return "done"

    try:
        first = asyncio.ensure_future(off.run(blocker))
        second = asyncio.ensure_future(off.run(ran.append, "second"))
        assert await asyncio.to_thread(started.wait, 60)
        first.cancel()  # running: it still runs to its end
        second.cancel()  # queued behind it: never run
        release.set()
        await off.run(ran.append, "third")  # after both, on the same thread
        assert ran == ["blocker", "third"]
        assert first.cancelled() and second.cancelled()
    finally:
        off.close()


async def test_close_cancels_what_has_not_started_and_refuses_more() -> None:
    off = Offloader(1, "t-close")
    release, started = threading.Event(), threading.Event()

    def blocker() -> bool:
        started.set()
        return release.wait(60)

    running = off.run(blocker)
    queued = off.run(int, "1")
    assert await asyncio.to_thread(started.wait, 60)
    off.close()
    release.set()
    assert await running is True  # the call that had started ends
    with pytest.raises(asyncio.CancelledError):
        await queued
    with pytest.raises(RuntimeError, match="closed"):
        off.run(int, "2")


def test_one_offloader_serves_one_event_loop_after_another() -> None:
    off = Offloader(1, "t-loops")
    try:
        for i in range(3):
            assert asyncio.run(_twice(off, i)) == 2 * i
    finally:
        off.close()


async def _twice(off: Offloader, i: int) -> int:
    return await off.run(lambda: 2 * i)


def test_an_offloader_needs_a_thread() -> None:
    with pytest.raises(ValueError):
        Offloader(0, "none")


async def test_an_offloader_nobody_closed_stops_its_threads_when_collected() -> None:
    off = Offloader(2, "t-collected")
    assert await off.run(int, "3") == 3
    names = {t.name for t in threading.enumerate() if t.name.startswith("t-collected-")}
    assert len(names) == 2
    del off
    gc.collect()  # the finalizer puts a stop for each thread
    for t in threading.enumerate():
        if t.name.startswith("t-collected-"):
            await asyncio.to_thread(t.join, 60)
    assert not [t for t in threading.enumerate() if t.name.startswith("t-collected-")]
