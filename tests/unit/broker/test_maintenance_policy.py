"""The pure maintenance policy (broker/maintenance_policy.py): merge planning and
retention victims."""

from __future__ import annotations

from broker.maintenance_policy import next_merge_look, plan_merges, retention_victims
from broker.partition import SegmentMeta


def seg(base: int, last: int, size: int = 100, max_ts: int = 0) -> SegmentMeta:
    return SegmentMeta(base, last, size, last - base + 1, max_ts, f"e{base}")


def test_plan_merges_cuts_runs_at_big_ineligible_gaps_and_limits() -> None:
    segs = [seg(0, 0), seg(1, 1), seg(2, 2), seg(3, 9, size=5000), seg(10, 10), seg(11, 11)]
    segs += [seg(13, 13), seg(14, 14), seg(15, 15)]  # a gap at 12
    runs = plan_merges(segs, lambda s: True, 1000, 10_000, 2, 100)
    assert [[s.base for s in r] for r in runs] == [[0, 1, 2], [10, 11], [13, 14, 15]]
    # min_count
    runs = plan_merges(segs, lambda s: True, 1000, 10_000, 3, 100)
    assert [[s.base for s in r] for r in runs] == [[0, 1, 2], [13, 14, 15]]
    # max_count and max_bytes split runs
    runs = plan_merges(segs[:3], lambda s: True, 1000, 10_000, 2, 2)
    assert [[s.base for s in r] for r in runs] == [[0, 1]]
    runs = plan_merges(segs[:3], lambda s: True, 1000, 250, 1, 100)
    assert [[s.base for s in r] for r in runs] == [[0, 1]]
    # eligibility (age) stops a run
    runs = plan_merges(segs, lambda s: s.base < 11, 1000, 10_000, 2, 100)
    assert [[s.base for s in r] for r in runs] == [[0, 1, 2]]


def test_retention_victims_by_time_and_bytes_never_the_last() -> None:
    segs = [seg(0, 9, 100, max_ts=1000), seg(10, 19, 100, 2000), seg(20, 29, 100, 3000)]
    assert retention_victims(segs, 10_000, -1, -1) == 0
    assert retention_victims(segs, 10_000, 100, -1) == 2  # all old, but never the last
    assert retention_victims(segs, 3_500, 1_000, -1) == 2  # max_ts < 2500: first two
    assert retention_victims(segs, 2_500, 1_000, -1) == 1
    assert retention_victims(segs, 10_000, -1, 200) == 1  # 300 -> 200
    assert retention_victims(segs, 10_000, -1, 150) == 1  # dropping a 2nd leaves 100 < 150
    assert retention_victims(segs, 10_000, -1, 0) == 2
    # time stops at the first young segment even if later ones are older
    mixed = [seg(0, 9, max_ts=5000), seg(10, 19, max_ts=1), seg(20, 29, max_ts=1)]
    assert retention_victims(mixed, 6000, 2000, -1) == 0
    # unknown timestamps (-1) never expire by time
    assert retention_victims([seg(0, 0, max_ts=-1), seg(1, 1)], 10**12, 1, -1) == 0


def test_plan_merges_releases_a_lone_shared_range() -> None:
    """A run shorter than the minimum is still merged when it holds a range of a shared
    object to release (docs/format.md, "Shared objects"); others wait for neighbours."""
    shared = SegmentMeta(10, 19, 100, 10, 0, "e", "~0-ab-000000000001.kfm#8+100")
    segs = [seg(0, 9, size=5000), shared, seg(20, 29, size=5000), seg(30, 39)]

    def plan(release: bool) -> list[list[int]]:
        runs = plan_merges(
            segs, lambda _s: True, 1000, 10_000, 4, 100,
            lambda s: release and s.key.startswith("~"),
        )  # fmt: skip
        return [[s.base for s in run] for run in runs]

    assert plan(False) == []
    assert plan(True) == [[10]]  # the lone plain segment at 30 still waits


def test_next_merge_look_is_the_first_segment_to_come_of_age() -> None:
    shared = SegmentMeta(20, 29, 100, 10, 0, "e", "~0-ab-000000000001.kfm#8+100")
    segs = [seg(0, 9, size=5000), seg(10, 19), shared]
    seen = {0: 0.0, 10: 5.0, 20: 7.0}

    def look(now: float) -> float:
        return next_merge_look(segs, seen, now, 1000, 2.0, 60.0)

    # the big segment never counts; 10 comes of age at 7, the shared range at 9 and 67
    assert look(6.0) == 7.0
    assert look(7.0) == 9.0  # 10 is of age now: the next time ahead is the shared range's
    assert look(9.0) == 67.0  # ... then its release
    assert look(67.0) == float("inf")  # nothing is ahead: only a change brings a new look
    # a base not seen yet is seen now: it comes of age min_age from now
    assert next_merge_look([seg(40, 49)], {}, 100.0, 1000, 2.0, 60.0) == 102.0
