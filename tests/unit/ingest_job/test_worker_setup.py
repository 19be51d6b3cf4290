"""Once-per-worker settings (``ingest_job.worker_setup``), checked in this process and
restored afterwards."""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Iterator

import pytest

from ingest_job import worker_setup

SIZE = 48 * 1024 * 1024


@pytest.fixture
def fresh_state() -> Iterator[None]:
    saved = dict(worker_setup._state)
    worker_setup._state.update(allocator=False, frozen=False)
    try:
        yield
    finally:
        worker_setup._state.update(saved)


def _anon_maps_of_at_least(size: int) -> int:
    count = 0
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if hi - lo >= size and len(fields) < 6:  # anonymous: no path
                count += 1
    return count


def test_freeze_heap_freezes_once(fresh_state: None) -> None:
    assert gc.get_freeze_count() == 0
    try:
        worker_setup.freeze_heap()
        frozen = gc.get_freeze_count()
        assert frozen > 1000  # this process's modules and classes
        junk = [[i] for i in range(1000)]
        worker_setup.freeze_heap()  # once only: the new objects stay collectable
        # nothing new frozen (a second freeze would add the 1,000 lists); the count may
        # fall meanwhile, as frozen objects that other threads let go are freed
        assert gc.get_freeze_count() <= frozen
        del junk
    finally:
        gc.unfreeze()


def test_tune_allocator_keeps_large_blocks_off_mmap(fresh_state: None) -> None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt  # noqa: B018
    except (OSError, AttributeError):
        pytest.skip("not glibc: tune_allocator does nothing here")
    before = _anon_maps_of_at_least(SIZE)
    block = bytes(SIZE)  # glibc's default: a mapping of its own
    assert _anon_maps_of_at_least(SIZE) == before + 1
    del block
    try:
        worker_setup.tune_allocator()
        block = bytes(SIZE)  # now from the heap
        assert sum(block[:: 1 << 20]) == 0
        heap_maps = _anon_maps_of_at_least(SIZE)
        assert heap_maps == before  # not a mapping of its own
        del block
        again = bytes(SIZE)  # the freed heap is reused
        assert _anon_maps_of_at_least(SIZE) == heap_maps
        del again
    finally:
        libc.mallopt(worker_setup.M_MMAP_MAX, 65536)  # glibc's defaults
        libc.mallopt(worker_setup.M_TRIM_THRESHOLD, 128 * 1024)
