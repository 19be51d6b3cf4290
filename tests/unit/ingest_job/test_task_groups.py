"""Work units grouped into Spark tasks (``ingest_job.manifest.task_groups``)."""

from __future__ import annotations

from ingest_job.manifest import UNITS_PER_TASK, task_groups
from ingest_job.model import SegmentRef, WorkUnit


def _unit(uid: int, size: int) -> WorkUnit:
    seg = SegmentRef("t", uid % 3, 0, 9, size, 10, "etag", f"k{uid}")
    return WorkUnit(uid, "t", uid % 3, 0, 10, (seg,))


def _ids(groups: list[list[WorkUnit]]) -> list[list[int]]:
    return [[u.unit_id for u in g] for g in groups]


def test_one_task_per_core_balanced_by_bytes() -> None:
    # the bench's shape: two partitions of a 64 MiB unit and a smaller one
    units = [_unit(0, 64), _unit(1, 39), _unit(2, 64), _unit(3, 39)]
    groups = task_groups(units, 2)
    assert sorted(_ids(groups)) == [[0, 1], [2, 3]]
    assert [sum(u.size for u in g) for g in groups] == [103, 103]


def test_fewer_units_than_cores_and_none() -> None:
    assert _ids(task_groups([_unit(0, 5)], 8)) == [[0]]
    assert task_groups([], 2) == []
    assert _ids(task_groups([_unit(0, 5), _unit(1, 7)], 0)) == [[0, 1]]


def test_many_units_spread_over_more_tasks_each_unit_once() -> None:
    units = [_unit(i, 10 + (i * 7) % 13) for i in range(40)]
    groups = task_groups(units, 2)
    assert len(groups) == 40 // UNITS_PER_TASK
    assert sorted(u for g in _ids(groups) for u in g) == list(range(40))
    assert all(g == sorted(g) for g in _ids(groups))  # in unit order inside a task
    loads = [sum(u.size for u in g) for g in groups]
    assert max(loads) - min(loads) <= max(u.size for u in units)
