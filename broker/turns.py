"""When a long loop on the event loop gives the loop a turn (docs/benchmarks.md,
"Round 21" and "Round 22").

A pass over every owned partition (the maintenance pass, the ownership check) runs on the
event loop between flush cycles. A turn every fixed number of partitions bounds it only
as long as each partition's look is cheap: an idle one takes ~5 us, but one written
lately is looked at by the merger, the compactor and the producer snapshot (coroutines
that often finish without suspending), and 256 of those held the loop 3-13 ms beside
4,000 partitions, once a second, in the way of a paced producer's flush cycles.
``TurnBudget.due`` also asks for a turn once the loop has been held ``budget_s``.

A turn is a pause of ``PAUSE_S``, not ``sleep(0)``: a flush cycle moves one step per turn
of the loop (the segment's PUT handed to a thread, its answer, the commit, the
responses), so a pass whose pieces come back to back, even 1 ms each, still stretched
each cycle across the pass. Beside 4,000 partitions that was a stall of a paced
producer's messages once a second (p99 21.4 ms). With the loop left idle for a
millisecond between two pieces the cycles run at their own pace (p99 9.2 ms;
docs/benchmarks.md, "Round 22"); the pass takes that much longer.
"""

from __future__ import annotations

import time

#: at most this many items between two turns (cheap items: the clock is read anyway)
ITEMS_PER_TURN = 256
#: and at most this long (a flush cycle's timer waits behind it)
TURN_BUDGET_S = 0.001
#: how long a turn leaves the loop to everything else
PAUSE_S = 0.001


class TurnBudget:
    """``if budget.due(): await asyncio.sleep(PAUSE_S)`` once per item of a long loop."""

    __slots__ = ("_items", "_budget", "_count", "_since")

    def __init__(self, items: int = ITEMS_PER_TURN, budget_s: float = TURN_BUDGET_S) -> None:
        self._items = items
        self._budget = budget_s
        self._count = 0
        self._since = time.perf_counter()

    def due(self) -> bool:
        """True when the caller should give the loop a turn now (then counts afresh)."""
        self._count += 1
        now = time.perf_counter()
        if self._count < self._items and now - self._since < self._budget:
            return False
        self._count, self._since = 0, now
        return True
