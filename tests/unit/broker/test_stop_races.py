"""A broker's background loops end when they are cancelled, even in the same turn of the
event loop as whatever wakes them.

On Python 3.11, ``asyncio.wait_for`` swallows a cancellation that comes as the awaited
thing completes: a loop around it went on waiting, and whoever awaited it after cancelling
it hung forever. That is what a broker whose listener port was taken did: ``asyncio.run``
cancelled every task of the failed start at once, while a membership change woke the
loops, and the process never exited (nor did ``kafscale broker --workers``'s supervisor,
waiting for it). The loops now wait with ``asyncio.timeout``, and ruff bans ``wait_for``
outside the tests (pyproject.toml).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from broker.cluster import Cluster
from broker.config import BrokerConfig
from broker.meta.base import MetaStore
from broker.server import Broker
from broker.tasks import cancel_and_wait
from tests.unit.broker.maintenance_helpers import config

DEADLINE_S = 60.0  # a hang, not a slow machine, is what runs past it


async def _parked() -> None:
    """Let every task that was just started reach its first wait."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_the_lease_keepalive_stops_when_poked_as_it_is_stopped(meta: MetaStore) -> None:
    cluster = Cluster(meta, BrokerConfig(lease_ttl_s=30))  # its timer stays far off
    await cluster.start()
    await _parked()
    me = asyncio.current_task()
    loops = [t for t in asyncio.all_tasks() if t is not me]
    assert "lease-keepalive" in {t.get_name() for t in loops}
    cluster.check_lease()  # the keep-alive's wait completes...
    stopping = asyncio.create_task(cluster.stop())  # ...as it is cancelled
    # not a deadline on stop() itself: cancelling it would cancel what it waits for
    done, _ = await asyncio.wait([stopping], timeout=DEADLINE_S)
    alive = [t.get_name() for t in loops if not t.done()]
    await cancel_and_wait(stopping)
    assert done, f"stop() never returned: {alive} outlived their cancellation"
    assert alive == []


async def test_a_failed_start_cancels_every_loop_as_membership_wakes_them(tmp_path: Path) -> None:
    """What ``asyncio.run`` does once ``Broker.start`` raises: cancel every task at once.
    Here a membership change has just woken the lease keep-alive, the ownership reconciler
    and the transaction-marker writer: their waits are complete, but they have not run."""
    b = Broker(config(tmp_path, lease_ttl_s=30))
    await b.start()
    try:
        await _parked()
        b.cluster.check_lease()
        b.cluster._notify()  # every membership listener: reconciler, marker writer, ...
        await asyncio.sleep(0)  # one turn: what the events woke is scheduled, not yet run
        me = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not me]
        assert tasks, "the broker runs background loops"
        for t in tasks:
            t.cancel()
        await asyncio.wait(tasks, timeout=DEADLINE_S)
        alive = sorted(t.get_name() for t in tasks if not t.done())
        assert alive == [], f"tasks still running after their cancellation: {alive}"
        survivors = [t.get_name() for t in tasks if not t.cancelled()]
        assert survivors == [], f"tasks that returned instead of ending cancelled: {survivors}"
    finally:
        async with asyncio.timeout(DEADLINE_S):
            await b.stop()


async def test_a_stopped_broker_leaves_no_task_behind(tmp_path: Path) -> None:
    """Every task a broker started ends with ``stop`` (the transaction coordinator's
    wait for a change was left pending: "Task was destroyed but it is pending!")."""
    me = asyncio.current_task()
    before = set(asyncio.all_tasks())
    b = Broker(config(tmp_path, lease_ttl_s=30, cycle_keys_min_partitions=2))
    await b.start()
    await b.topics.create("t", 2)
    await b.logs.get("t", 0)
    await _parked()
    async with asyncio.timeout(DEADLINE_S):
        await b.stop()
    await asyncio.sleep(0)  # a cancelled task ends on its next turn
    left = sorted(
        f"{t.get_name()} {t.get_coro().__qualname__}"  # type: ignore[union-attr]
        for t in asyncio.all_tasks() - before
        if t is not me and not t.done()
    )
    assert left == []
