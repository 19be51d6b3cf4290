"""broker.flush scheduling: when the flusher starts a cycle (``--flush-when-idle``, the
flush-interval timer, cycles in flight). The real ``Flusher`` loop, its ``appended`` and
its cycle bookkeeping; the cycles themselves are gated stand-ins (no store, no commit:
what they write is tested in tests/integration/broker/test_flush_pipeline.py), and the
flush interval is an hour, so a cycle that starts did not start on its timer."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

from broker.config import BrokerConfig
from broker.flush import Flusher, Job
from broker.log_metrics import LogMetrics

HOUR_MS = 3_600_000
DEADLINE_S = 30.0


@dataclass(eq=False)
class FakeLog:
    """What the scheduler reads of a PartitionLog: its buffered batches."""

    name: str
    pending: list[str] = field(default_factory=list)
    pending_bytes: int = 0
    pending_since: float = 0.0
    flushing: Any = None

    def append(self, batch: str) -> None:
        if not self.pending:
            self.pending_since = asyncio.get_running_loop().time()
        self.pending.append(batch)
        self.pending_bytes += 100

    def take_pending(self) -> list[str]:
        out, self.pending, self.pending_bytes = self.pending, [], 0
        return out


class GatedFlusher(Flusher):
    """Each cycle records what it took, then waits until the test releases it."""

    def __init__(self, when_idle: bool) -> None:
        cfg = BrokerConfig(flush_interval_ms=HOUR_MS, flush_when_idle=when_idle)
        super().__init__(cast(Any, SimpleNamespace(config=cfg, metrics=LogMetrics())))
        self.taken: list[list[str]] = []
        self.started = asyncio.Event()
        self.gates: list[asyncio.Event] = []

    async def cycle(self, jobs: list[Job], prev: asyncio.Task[None] | None = None) -> None:
        gate = asyncio.Event()
        self.gates.append(gate)
        self.taken.append([b for _lg, pend in jobs for b in cast(list[str], pend)])
        self.started.set()
        await gate.wait()
        if prev is not None:
            await asyncio.wait([prev])

    async def next_cycle(self) -> list[str]:
        await asyncio.wait_for(self.started.wait(), DEADLINE_S)
        self.started.clear()
        return self.taken[-1]


def append(f: Flusher, lg: FakeLog, batch: str) -> None:
    lg.append(batch)
    f.appended(cast(Any, lg), 100)


async def settle() -> None:
    """Until every finished cycle's callbacks and the flusher's wake-up have run."""
    for _ in range(20):
        await asyncio.sleep(0)


async def test_appends_made_during_the_only_cycle_start_theirs_when_it_ends() -> None:
    f = GatedFlusher(when_idle=True)
    f.start()
    try:
        lg = FakeLog("p0")
        append(f, lg, "a")  # idle: a cycle starts at once
        assert await f.next_cycle() == ["a"]
        append(f, lg, "b")  # a cycle in flight: b waits for the (hour-long) timer...
        append(f, lg, "c")
        await settle()
        assert len(f.taken) == 1 and f._timer is not None
        f.gates[0].set()  # ...until the flusher is idle again: then at once
        assert await f.next_cycle() == ["b", "c"]
        assert f._timer is None
    finally:
        for g in f.gates:
            g.set()
        await f.stop()


async def test_without_flush_when_idle_the_timer_alone_starts_cycles() -> None:
    f = GatedFlusher(when_idle=False)
    f.start()
    try:
        lg = FakeLog("p0")
        append(f, lg, "a")
        await settle()
        assert f.taken == [] and f._timer is not None  # waits for its interval
        f._timer.cancel()
        f._fire()  # the interval is up
        assert await f.next_cycle() == ["a"]
        append(f, lg, "b")
        f.gates[0].set()
        await settle()
        assert len(f.taken) == 1 and f._timer is not None  # b still waits for its timer
        assert not f._cycles
    finally:
        for g in f.gates:
            g.set()
        await f.stop()


async def test_a_cycle_ending_while_another_is_in_flight_starts_nothing() -> None:
    """Flush-when-idle means no cycle in flight: with one left, the timer decides."""
    f = GatedFlusher(when_idle=True)
    f.start()
    try:
        lg = FakeLog("p0")
        append(f, lg, "a")
        assert await f.next_cycle() == ["a"]
        append(f, lg, "b")
        assert f._timer is not None
        f._timer.cancel()
        f._fire()  # b's interval is up: a second cycle in flight
        assert await f.next_cycle() == ["b"]
        append(f, lg, "c")
        f.gates[0].set()  # the first ends; the second is still in flight
        await settle()
        assert len(f._cycles) == 1 and len(f.taken) == 2 and f._timer is not None
        f.gates[1].set()  # now none is in flight: c starts at once
        assert await f.next_cycle() == ["c"]
    finally:
        for g in f.gates:
            g.set()
        await f.stop()


async def test_the_timer_records_how_late_it_ran() -> None:
    f = GatedFlusher(when_idle=False)
    lg = FakeLog("p0")
    append(f, lg, "a")
    timer = f._timer
    assert timer is not None
    timer.cancel()
    f._fire()  # an hour early: recorded as no lag, never negative
    hist = f.logs.metrics.flush_timer_delay
    assert sum(hist.counts) == 1 and hist.sum == 0.0
