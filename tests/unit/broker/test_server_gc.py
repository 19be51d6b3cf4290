"""broker.server.freeze_startup_objects: the start-up's garbage is collected, what is
alive is frozen out of the cyclic collector's generations, and garbage made later is
still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from broker.server import freeze_startup_objects


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
    assert frozen == gc.get_freeze_count() > 0
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
