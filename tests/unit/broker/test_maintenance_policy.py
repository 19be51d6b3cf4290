"""The pure maintenance policy (broker/maintenance_policy.py): merge planning and
retention victims."""

from __future__ import annotations

import math

from broker.maintenance_policy import next_merge_look, plan_merges, retention_victims, tier
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


def test_tier_leaves_out_heads_larger_than_the_rest() -> None:
    run = [seg(0, 9, 900), seg(10, 19, 300), seg(20, 20, 200), seg(21, 21, 100)]
    assert [s.base for s in tier(run, 0)] == [10, 20, 21]  # 900 > 600, then 300 <= 300
    assert [s.base for s in tier(run[1:], 0)] == [10, 20, 21]
    assert [s.base for s in tier([seg(0, 9, 301), *run[2:]], 0)] == [21]  # 301 > 300, 200 > 100
    assert [s.base for s in tier(run[3:] * 3, 0)] == [21, 21, 21]  # equal sizes: all kept
    assert [s.base for s in tier([seg(0, 0, 100), seg(1, 9, 900)], 0)] == [0, 1]  # head smaller
    assert [s.base for s in tier([seg(0, 0, 5)], 0)] == [0]
    # a range to release stays in its run, however large
    assert [s.base for s in tier(run, 0, lambda s: s.base == 0)] == [0, 10, 20, 21]
    # below the floor a head is rewritten with the rest, as before the tiering
    assert [s.base for s in tier(run, 901)] == [0, 10, 20, 21]
    assert [s.base for s in tier(run, 900)] == [10, 20, 21]
    assert [s.base for s in tier(run, 301)] == [10, 20, 21]  # 300 <= 300 anyway


def test_plan_merges_tiers_above_a_64th_of_small_bytes() -> None:
    young = [seg(0, 9, 900), seg(10, 10, 100), seg(11, 11, 100)]
    # 64,000 small: the floor is 1,000, so 900 is rewritten with the two after it
    assert plan_merges(young, lambda _s: True, 64_000, 10**9, 2, 100) == [young]
    # 57,600 small: the floor is 900, and 900 > 200 is left out
    assert plan_merges(young, lambda _s: True, 57_600, 10**9, 2, 100) == [young[1:]]
    assert plan_merges(young, lambda _s: True, 64_000, 10**9, 2, 100, tier_bytes=0) == [young[1:]]


def _rewrites(seg_bytes: int, every_s: float, seconds: float) -> tuple[float, int, int]:
    """A partition that gets one ``seg_bytes`` segment per ``every_s`` and a merge pass
    per second (merges of age 2 s, runs of 4, 1 MiB small, so tiered above 16 KiB):
    (bytes rewritten per byte produced, the most times any byte was rewritten, the most
    small merged segments at once)."""
    small = 1 << 20
    segs: list[SegmentMeta] = []
    seen: dict[int, float] = {}
    times: dict[int, int] = {}  # base -> the most rewrites of any byte in the segment
    t = next_pass = 0.0
    produced = rewritten = worst = most_merged = 0
    while t < seconds:
        t += every_s
        base = len(seen)
        segs.append(seg(base, base, seg_bytes))
        seen[base], times[base] = t, 0
        produced += seg_bytes
        if t < next_pass:
            continue
        next_pass += 1.0
        aged = lambda s, now=t: now - seen[s.base] >= 2.0  # noqa: E731
        for run in plan_merges(segs, aged, small, 16 << 20, 4, 127):
            merged = seg(run[0].base, run[-1].last, sum(s.size for s in run))
            times[merged.base] = 1 + max(times[s.base] for s in run)
            worst = max(worst, times[merged.base])
            rewritten += merged.size
            i = segs.index(run[0])
            segs[i : i + len(run)] = [merged]
        most_merged = max(most_merged, sum(1 for s in segs if s.last > s.base and s.size < small))
    return rewritten / produced, worst, most_merged


def test_merges_rewrite_each_byte_about_log2_times_not_once_per_pass() -> None:
    """Before the tiering a merged segment was merged again at every pass until it
    reached 1 MiB: a partition at 2 KiB/s had its bytes rewritten 76 times over, one at
    32 KiB/s 8 times. Now a byte is rewritten once per pass until its segment reaches
    16 KiB (1 MiB / 64), and about log2(1 MiB / its size then) times after that; the small
    merged segments stay about as many."""
    floor = (1 << 20) // 64
    for seg_bytes, every_s in [(2 << 10, 1.0), (16 << 10, 0.5), (16 << 10, 0.1), (1 << 10, 0.01)]:
        per_pass = seg_bytes * max(4, round(1 / every_s))  # the first merge's bytes at least
        below = math.ceil(floor / per_pass)  # passes a byte may spend below the floor
        bound = below + math.ceil(math.log2((1 << 20) / max(per_pass, floor))) + 1
        amplification, worst, merged = _rewrites(seg_bytes, every_s, 600.0)
        assert worst <= bound, (seg_bytes, every_s, worst, bound)
        assert amplification <= bound
        assert merged <= bound
    assert _rewrites(2 << 10, 1.0, 600.0)[0] < 5  # 75.8 before the tiering
