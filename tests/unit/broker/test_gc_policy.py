"""broker.gc_policy: the start-up's garbage is collected and what is alive frozen; once
installed, the survivors of every full collection are frozen too, garbage made since is
still collected, and garbage cycles among frozen objects are found by a thaw. The
collector is the process's: each test gives it back as it was (callback removed,
everything unfrozen)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from broker.gc_policy import GcPolicy, freeze_startup_objects


class Node:
    def __init__(self) -> None:
        self.peer: Node | None = None


def _cycle() -> weakref.ref[Node]:
    a, b = Node(), Node()
    a.peer, b.peer = b, a
    return weakref.ref(a)


@pytest.fixture
def thawed() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test session as it was


@pytest.mark.usefixtures("thawed")
def test_startup_garbage_is_collected_and_the_rest_frozen() -> None:
    garbage = _cycle()
    kept = Node()
    frozen = freeze_startup_objects()
    assert garbage() is None  # collected first, not frozen
    # every object frozen is counted; one may die since (a thread an earlier test left
    # behind lets go of its last reference), none is frozen since
    assert 0 < gc.get_freeze_count() <= frozen
    # alive at the freeze: no longer in any generation the collector walks
    assert not any(o is kept for o in gc.get_objects())
    later = Node()
    assert any(o is later for o in gc.get_objects())


@pytest.mark.usefixtures("thawed")
def test_garbage_made_after_the_freeze_is_still_collected() -> None:
    freeze_startup_objects()
    garbage = _cycle()
    assert garbage() is not None  # only a cycle holds it: reference counting cannot
    gc.collect()
    assert garbage() is None


@pytest.fixture
def policy() -> Iterator[GcPolicy]:
    gc.unfreeze()
    p = GcPolicy(thaw_interval_s=0.01)
    try:
        yield p
    finally:
        p.uninstall()
    assert p._after_collection not in gc.callbacks


def _tracked(obj: object) -> bool:
    """``obj`` is in a generation the collector walks (not frozen)."""
    return any(o is obj for o in gc.get_objects())


def test_survivors_of_each_full_collection_are_frozen(policy: GcPolicy) -> None:
    policy.install()
    later = Node()
    assert _tracked(later)
    before = gc.get_freeze_count()
    gc.collect()  # a full collection, as the collector's own would be
    assert policy.freezes == 1
    assert not _tracked(later)  # frozen with the other survivors
    assert gc.get_freeze_count() > before
    gc.collect(0)  # a young collection freezes nothing
    assert policy.freezes == 1


def test_cycles_made_after_a_freeze_are_still_collected(policy: GcPolicy) -> None:
    policy.install()
    gc.collect()
    garbage = _cycle()
    assert garbage() is not None  # only a cycle holds it: reference counting cannot
    gc.collect()
    assert garbage() is None


def test_a_frozen_cycle_is_found_only_by_a_thaw(policy: GcPolicy) -> None:
    policy.install()
    a = Node()
    a.peer = Node()
    a.peer.peer = a
    gc.collect()  # both alive: frozen
    ref = weakref.ref(a)
    del a  # now garbage, inside a cycle of frozen objects
    gc.collect()
    assert ref() is not None  # a full collection does not see frozen objects
    assert policy.thaw_and_collect() >= 2
    assert ref() is None
    assert policy.thaws == 1 and policy.thaw_collected >= 2
    assert gc.get_freeze_count() > 0  # the survivors frozen again


async def test_the_thaws_run_on_their_schedule(policy: GcPolicy) -> None:
    policy.install()
    thawed = asyncio.Event()
    thaw = policy.thaw_and_collect

    def counting() -> int:
        n = thaw()
        if policy.thaws >= 2:
            thawed.set()
        return n

    policy.thaw_and_collect = counting  # type: ignore[method-assign]
    task = asyncio.create_task(policy.run())
    try:
        await asyncio.wait_for(thawed.wait(), 60)
    finally:
        task.cancel()
    assert policy.thaws >= 2


def test_uninstall_gives_every_object_back(policy: GcPolicy) -> None:
    policy.install()
    gc.collect()
    assert gc.get_freeze_count() > 0
    policy.uninstall()
    assert gc.get_freeze_count() == 0
    assert policy._after_collection not in gc.callbacks
    gc.collect()
    assert policy.freezes == 1  # no longer called
