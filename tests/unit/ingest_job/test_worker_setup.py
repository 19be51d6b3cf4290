"""Once-per-worker settings (``ingest_job.worker_setup``), checked in this process and
restored afterwards."""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Iterator

import pytest

from broker.heap_trim import _MallInfo2
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


def _mallinfo() -> _MallInfo2:
    """glibc's allocator figures (2.33+): ``hblkhd`` is the bytes in blocks with a
    mapping of their own, ``arena`` the heap's. Counting the process's mappings instead
    was flaky: the kernel merges a new anonymous mapping into a large neighbour."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    libc.mallinfo2.argtypes = []
    info: _MallInfo2 = libc.mallinfo2()
    return info


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
        libc.mallinfo2  # noqa: B018
    except (OSError, AttributeError):
        pytest.skip("not glibc 2.33+ (no mallopt or mallinfo2): nothing to check here")
    mapped = _mallinfo().hblkhd
    block = bytes(SIZE)  # glibc's default: a mapping of its own
    assert _mallinfo().hblkhd >= mapped + SIZE
    del block
    try:
        worker_setup.tune_allocator()
        mapped = _mallinfo().hblkhd
        block = bytes(SIZE)  # now from the heap
        assert sum(block[:: 1 << 20]) == 0
        assert _mallinfo().hblkhd < mapped + SIZE  # not a mapping of its own
        heap = _mallinfo().arena
        assert heap >= SIZE
        del block
        again = bytes(SIZE)  # the freed heap is reused: the heap does not grow by it
        assert _mallinfo().arena < heap + SIZE
        assert _mallinfo().hblkhd < mapped + SIZE
        del again
    finally:
        libc.mallopt(worker_setup.M_MMAP_MAX, 65536)  # glibc's defaults
        libc.mallopt(worker_setup.M_TRIM_THRESHOLD, 128 * 1024)
