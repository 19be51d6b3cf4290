"""Once-per-worker settings (``ingest_job.worker_setup``), checked in this process and
restored afterwards. The allocator's is checked in a fresh process
(tests/integration/ingest_job/test_worker_allocator.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from ingest_job import worker_setup


@pytest.fixture
def fresh_state() -> Iterator[None]:
    saved = dict(worker_setup._state)
    worker_setup._state.update(allocator=False, frozen=False)
    try:
        yield
    finally:
        worker_setup._state.update(saved)


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
