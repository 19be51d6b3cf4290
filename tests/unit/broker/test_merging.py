"""When merges look at a partition (broker/merging.py), on an in-process broker over a
real local-directory store and embedded metadata store: a partition with nothing new is
not planned again until a segment comes of age, and any change to its segments brings a
new look at once. Looks are counted by ``Maintenance.stats["merge_plans"]`` and driven
with an explicit monotonic time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.partition import PartitionLog
from broker.server import Broker
from tests.unit.broker.maintenance_helpers import TOPIC, config, expected, maint, produce, read_all

AGE_S = 30.0


@pytest.fixture
async def three(tmp_path: Path) -> AsyncIterator[tuple[Broker, PartitionLog]]:
    """A broker whose merges wait ``AGE_S``, and its partition with three small segments."""
    b = Broker(config(tmp_path, merge_min_age_ms=int(AGE_S * 1000)))
    await b.start()
    try:
        await b.topics.create(TOPIC, 1)
        await produce(b.logs, 3)
        yield b, await b.logs.get(TOPIC, 0)
    finally:
        await b.stop()


async def test_an_unchanged_partition_is_looked_at_again_only_when_a_segment_comes_of_age(
    three: tuple[Broker, PartitionLog],
) -> None:
    b, lg = three
    m = maint(b)
    plans = m.stats["merge_plans"]
    t0 = 1000.0
    assert await m.merge_partition(lg, now=t0) == 0  # too young
    assert m.stats["merge_plans"] == plans + 1
    assert await m.merge_partition(lg, now=t0 + AGE_S - 1) == 0
    assert m.stats["merge_plans"] == plans + 1  # nothing changed, none of age: skipped
    await produce(b.logs, 1, start=3)  # a new segment: looked at again at once
    assert await m.merge_partition(lg, now=t0 + 1) == 0
    assert m.stats["merge_plans"] == plans + 2
    # the first three come of age at t0 + AGE_S, the fourth one second later
    assert await m.merge_partition(lg, now=t0 + AGE_S) == 1
    assert m.stats["merge_plans"] == plans + 3
    assert [(s.base, s.last) for s in lg.segments] == [(0, 5), (6, 7)]
    # the merge changed the segments: the next look plans again (nothing to merge:
    # a run needs two of age), then waits for the fourth segment's age
    assert await m.merge_partition(lg, now=t0 + AGE_S) == 0
    assert m.stats["merge_plans"] == plans + 4
    assert await m.merge_partition(lg, now=t0 + AGE_S + 0.5) == 0
    assert m.stats["merge_plans"] == plans + 4
    assert await m.merge_partition(lg, now=t0 + AGE_S + 1) == 1
    assert [(s.base, s.last) for s in lg.segments] == [(0, 7)]
    assert await read_all(b.logs, lg) == expected(4)
    # nothing small can come of age any more: quiet until the partition changes
    assert await m.merge_partition(lg, now=t0 + 10 * AGE_S) == 0
    plans_now = m.stats["merge_plans"]
    assert await m.merge_partition(lg, now=t0 + 1000 * AGE_S) == 0
    assert m.stats["merge_plans"] == plans_now


async def test_a_partition_forgotten_is_looked_at_afresh(
    three: tuple[Broker, PartitionLog],
) -> None:
    """A partition the maintenance was told to forget (handed off, taken again) keeps
    no memory of its earlier looks."""
    b, lg = three
    m = maint(b)
    assert await m.merge_partition(lg, now=1000.0) == 0
    plans = m.stats["merge_plans"]
    m.forget(lg)
    assert await m.merge_partition(lg, now=1001.0) == 0
    assert m.stats["merge_plans"] == plans + 1
