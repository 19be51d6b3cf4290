"""``cancel_and_wait`` (broker/tasks.py): every task ends, their exceptions are not
raised, and a cancellation of the caller while it waits is."""

from __future__ import annotations

import asyncio

import pytest

from broker.tasks import cancel_and_wait


async def test_every_task_ends_and_what_they_raise_is_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def fails_on_cancel() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            raise RuntimeError("cleanup failed")

    idle = asyncio.create_task(asyncio.Event().wait())
    failing = asyncio.create_task(fails_on_cancel())
    await asyncio.sleep(0)
    await cancel_and_wait(idle, None, failing)
    assert idle.cancelled()
    assert isinstance(failing.exception(), RuntimeError)
    assert "cleanup failed" in caplog.text  # logged, once retrieved


async def test_the_callers_cancellation_is_raised() -> None:
    release = asyncio.Event()

    async def slow_to_end() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await release.wait()  # its clean-up takes a while

    task = asyncio.create_task(slow_to_end())
    await asyncio.sleep(0)
    stopping = asyncio.create_task(cancel_and_wait(task))
    await asyncio.sleep(0)
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    assert not task.done()  # left to end on its own
    release.set()
    await asyncio.wait([task])
    assert task.cancelled()
