"""``HeapTrimmer`` against this process's real glibc heap: freed blocks in the middle of
the heap keep their pages until it trims (docs/operations.md, "Memory")."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.heap_trim import HeapTrimmer

MIB = 1024 * 1024
BLOCK = 96 * 1024  # below glibc's initial mmap threshold (128 KiB): from the heap


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _trimmer(min_free: int) -> HeapTrimmer:
    trimmer = HeapTrimmer.load(min_free)
    if trimmer is None:
        pytest.skip("the C library is not glibc 2.33+ (no mallinfo2): nothing to trim")
    return trimmer


def _free_in_the_middle(total: int) -> list[bytes]:
    """Fill ``total`` bytes of heap blocks (written: their pages are resident), then free
    every other one: half of it is free heap between blocks still in use, which glibc's
    own trim (the top of the heap only) never gives back. Returns the blocks kept."""
    blocks = [b"x" * BLOCK + bytes([i & 255]) for i in range(total // BLOCK)]
    kept = blocks[::2]
    blocks.clear()
    return kept


def test_trim_gives_free_heap_pages_back() -> None:
    trimmer = _trimmer(32 * MIB)
    kept = _free_in_the_middle(128 * MIB)
    assert trimmer.free_bytes() >= 48 * MIB
    before = _rss_bytes()
    assert trimmer.trim()
    assert before - _rss_bytes() >= 40 * MIB  # the free blocks' pages left the process
    assert trimmer.free_bytes() >= 48 * MIB  # still free heap: reused without a syscall
    assert (trimmer.trims, trimmer.checks) == (1, 1)
    assert kept


def test_below_the_minimum_nothing_is_trimmed() -> None:
    trimmer = _trimmer(1 << 40)
    kept = _free_in_the_middle(32 * MIB)
    before = _rss_bytes()
    assert not trimmer.trim()
    assert before - _rss_bytes() < 8 * MIB
    assert (trimmer.trims, trimmer.checks) == (0, 1)
    assert kept


def test_run_trims_on_its_schedule_until_cancelled() -> None:
    trimmer = _trimmer(1 << 40)  # looks, never trims: only the schedule is under test
    looked = trimmer.trim

    async def main() -> None:
        loop = asyncio.get_running_loop()
        third = asyncio.Event()

        def counted() -> bool:  # runs in the worker thread, as the real one does
            trimmed = looked()
            if trimmer.checks == 3:
                loop.call_soon_threadsafe(third.set)
            return trimmed

        trimmer.trim = counted  # type: ignore[method-assign]
        task = asyncio.create_task(trimmer.run(0.001))
        async with asyncio.timeout(60):
            await third.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert trimmer.checks >= 3 and trimmer.trims == 0
