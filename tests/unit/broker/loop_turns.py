"""Counting the turns of the running event loop while a block runs: a callback that
schedules itself again with ``call_soon`` runs once per turn. Used by the tests of work
that must let the loop run between its pieces (a scrape, a maintenance pass, the
ownership check)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager


class Turns:
    def __init__(self) -> None:
        self.count = 0
        self.running = True

    def tick(self) -> None:
        self.count += 1
        if self.running:
            asyncio.get_running_loop().call_soon(self.tick)


@contextmanager
def counting_turns() -> Iterator[Turns]:
    """The turns the loop takes while the block runs (call from a coroutine)."""
    turns = Turns()
    asyncio.get_running_loop().call_soon(turns.tick)
    try:
        yield turns
    finally:
        turns.running = False
