"""broker.logs.LogManager.reconcile_once (the ownership check of every held partition)
on an in-process broker over a real local-directory store and a real embedded metadata
store."""

from __future__ import annotations

from pathlib import Path

from broker.server import Broker
from tests.unit.broker.loop_turns import counting_turns
from tests.unit.broker.maintenance_helpers import config


async def test_the_ownership_check_over_many_partitions_lets_the_event_loop_run(
    tmp_path: Path,
) -> None:
    """``LogManager.reconcile_once`` hashes every held partition against the live
    brokers; over many it gives the loop a turn every ITEMS_PER_TURN of them, and a
    single broker hands none of its partitions off."""
    from broker.turns import ITEMS_PER_TURN

    b = Broker(config(tmp_path))
    await b.start()
    try:
        n = 3 * ITEMS_PER_TURN
        await b.topics.create("many", n)
        for p in range(n):
            await b.logs.get("many", p)
        with counting_turns() as turns:
            assert await b.logs.reconcile_once() == 0
        assert turns.count >= n // ITEMS_PER_TURN
        assert len(b.logs.logs) == n
    finally:
        await b.stop()
