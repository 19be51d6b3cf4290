"""How a broker process uses Python's cyclic garbage collector (docs/operations.md,
"Garbage collection"; docs/benchmarks.md, "Round 21").

A full collection walks every container object the collector tracks, so its pause grows
with the broker's long-lived state: the logs, producer states, cached segments and
metadata of every partition it owns. Measured with a consumer group over 4,000 owned
partitions, the full collections took 50-83 ms each, one every few seconds under a
metrics scrape. Most of what they walk survives: long-lived state, not garbage.

So, after start-up (:func:`freeze_startup_objects`), every object that survives a full
collection is frozen out of later ones (``gc.freeze`` from a ``gc.callbacks`` hook): the
next full collection walks only what was made since, and its pause depends on the
allocation rate, not on how much the broker owns (there: 1-5 ms). Reference counting
still frees a frozen object; one that becomes garbage inside a reference cycle after it
was frozen (a released partition's state, a finished task holding an exception) is only
found when everything is thawed: :meth:`GcPolicy.thaw_and_collect`, every
``--gc-thaw-interval-s`` (default 3600), one full collection over everything, after which
the survivors are frozen again. ``--gc-thaw-interval-s 0`` leaves the collector as Python
has it, start-up freeze included.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_THAW_INTERVAL_S = 3600.0


def freeze_startup_objects() -> int:
    """Collect the garbage of the start-up, then move every object alive now (modules,
    classes, functions, the configuration, the broker's long-lived state) out of the
    cyclic collector's reach (``gc.freeze``); returns how many were frozen. A full
    collection then walks only what was made since: on the project's VM a paced
    producer's slowest delivery fell from ~100 to ~35 ms, the full collections of a
    broker under load from 40-75 ms to ~5 ms (docs/benchmarks.md, "Round 19")."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class GcPolicy:
    """Freezes the survivors of every full collection; thaws and collects everything
    every ``thaw_interval_s``. One per process (the collector is): ``install()`` once
    the broker serves, ``run()`` as a task for the thaws (a stopping broker only cancels
    it: a thaw then would be one more long pause); ``uninstall()`` gives the collector
    back as it was (tests)."""

    def __init__(self, thaw_interval_s: float = DEFAULT_THAW_INTERVAL_S) -> None:
        self.thaw_interval_s = thaw_interval_s
        self.freezes = 0  # full collections whose survivors were frozen
        self.thaws = 0
        self.thaw_collected = 0  # garbage found among thawed objects, over all thaws
        self._installed = False

    def install(self) -> int:
        """Freeze the start-up's objects and freeze after every full collection from now
        on; returns how many objects were frozen."""
        frozen = freeze_startup_objects()
        if not self._installed:
            gc.callbacks.append(self._after_collection)
            self._installed = True
        return frozen

    def uninstall(self) -> None:
        """Stop freezing, and give every frozen object back to the collector."""
        if self._installed:
            with contextlib.suppress(ValueError):
                gc.callbacks.remove(self._after_collection)
            self._installed = False
        gc.unfreeze()

    def _after_collection(self, phase: str, info: dict[str, Any]) -> None:
        # runs in whichever thread triggered the collection, holding the GIL: freezing is
        # a splice of the collector's lists, no allocation, no object visited
        if phase == "stop" and info.get("generation") == 2:
            gc.freeze()
            self.freezes += 1

    def thaw_and_collect(self) -> int:
        """One full collection over every object, frozen ones included (garbage cycles
        among them are found only here); the survivors are frozen again. Returns how many
        objects it collected."""
        gc.unfreeze()
        collected = gc.collect()
        gc.freeze()
        self.thaws += 1
        self.thaw_collected += collected
        log.debug("garbage collector: %d objects collected after a thaw, %d frozen again",
                  collected, gc.get_freeze_count())  # fmt: skip
        return collected

    async def run(self) -> None:
        """Thaw and collect every ``thaw_interval_s`` until cancelled."""
        while True:
            await asyncio.sleep(self.thaw_interval_s)  # a schedule, not a wait for state
            self.thaw_and_collect()
