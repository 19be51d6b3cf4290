"""Maintenance policy, pure functions (no I/O): which runs of small segments to merge, and
how many head segments retention drops (docs/format.md, "Merged segments and the log
start"). ``broker.maintenance`` applies them on the owner.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from broker.partition import SegmentMeta


def plan_merges(
    segments: Sequence[SegmentMeta],
    eligible: Callable[[SegmentMeta], bool],
    small_bytes: int,
    max_bytes: int,
    min_count: int,
    max_count: int,
    release: Callable[[SegmentMeta], bool] = lambda _s: False,
    tier_bytes: int | None = None,
) -> list[list[SegmentMeta]]:
    """Runs of consecutive, contiguous, eligible segments each below ``small_bytes``; a
    run holds at most ``max_count`` segments and ``max_bytes`` bytes, at least
    ``max(2, min_count)`` segments, or fewer (one, even) when it holds a segment to
    ``release``: a range of a shared object that has waited long enough for neighbours
    (docs/format.md, "Shared objects": an idle partition's range would otherwise keep the
    whole shared object in the store for good).

    Size-tiered above ``tier_bytes`` (``small_bytes`` / 64 unless given): a run leaves
    out its first segments while each is at least that large and larger than all the
    segments after it together (``tier``). A merged segment is then rewritten only with
    at least as many bytes of newer data, not at every pass until it reaches
    ``small_bytes`` (docs/format.md, "Merged segments and the log start")."""
    runs: list[list[SegmentMeta]] = []
    cur: list[SegmentMeta] = []
    size = 0
    need = max(2, min_count)
    floor = small_bytes // 64 if tier_bytes is None else tier_bytes

    def close() -> None:
        run = tier(cur, floor, release)
        if len(run) >= need or any(release(s) for s in run):
            runs.append(run)
        cur.clear()

    for seg in segments:
        if seg.size >= small_bytes or not eligible(seg):
            close()
            size = 0
            continue
        if cur and (
            seg.base != cur[-1].last + 1 or len(cur) >= max_count or size + seg.size > max_bytes
        ):
            close()
            size = 0
        cur.append(seg)
        size += seg.size
    close()
    return runs


def tier(
    run: Sequence[SegmentMeta],
    floor: int,
    release: Callable[[SegmentMeta], bool] = lambda _s: False,
) -> list[SegmentMeta]:
    """``run`` without its first segments while each is at least ``floor`` bytes and
    larger than the rest of the run together (a range to ``release`` is never left out).
    With a segment per flush cycle and a merge per pass, a byte is then rewritten once per
    pass only until its segment reaches ``floor``, and about log2(``small_bytes`` /
    ``floor``) times after that: the bytes of a partition at 2 KiB/s were rewritten 76
    times over when every pass merged the small merged segment again (docs/benchmarks.md,
    "Round 18"). Below ``floor`` a rewrite costs little more than the request itself, and
    a partition's few small segments merge into one as before."""
    rest = sum(s.size for s in run)
    start = 0
    while len(run) - start > 1:
        head = run[start]
        rest -= head.size
        if release(head) or head.size < floor or head.size <= rest:
            break
        start += 1
    return list(run[start:])


def next_merge_look(
    segments: Sequence[SegmentMeta],
    seen: Mapping[int, float],
    now: float,
    small_bytes: int,
    min_age: float,
    release_age: float,
) -> float:
    """When ``plan_merges`` may next answer otherwise for segments that stay as they are:
    the first time after ``now`` that a small segment becomes old enough to merge
    (``seen``: when each base was first seen, + ``min_age``), or a shared range old enough
    to release (+ ``release_age``); infinity when no such time is ahead. Until then, a
    partition whose segments, log start, folded end and merge settings did not change is
    not planned again (``broker.merging.Merger.merge_partition``)."""
    first = float("inf")
    for seg in segments:
        if seg.size >= small_bytes:
            continue
        since = seen.get(seg.base, now)
        for age in (min_age, release_age) if seg.key.startswith("~") else (min_age,):
            due = since + age
            if now < due < first:
                first = due
    return first


def retention_of(configs: Mapping[str, str], _config: object = None) -> tuple[int, int] | None:
    """A topic's (``retention.ms``, ``retention.bytes``); None when its cleanup policy does
    not delete (``TopicManager.derived`` calls this once per version of the topic)."""
    if "delete" not in configs.get("cleanup.policy", "delete"):
        return None
    return int(configs.get("retention.ms", "-1")), int(configs.get("retention.bytes", "-1"))


def retention_victims(
    segments: Sequence[SegmentMeta], now_ms: int, retention_ms: int, retention_bytes: int
) -> int:
    """How many segments to drop from the head (never the last one), as Kafka does: while
    the head segment's max timestamp — and its write time: our segments are small, so a
    record with an old timestamp must not go the moment it lands — is older than
    ``retention_ms``, or while dropping it
    leaves the partition at least ``retention_bytes`` big (-1: no limit)."""
    total = sum(s.size for s in segments)
    n = 0
    for seg in segments[:-1]:
        by_time = retention_ms >= 0 and 0 <= seg.retention_ts < now_ms - retention_ms
        by_size = retention_bytes >= 0 and total - seg.size >= retention_bytes
        if not (by_time or by_size):
            break
        total -= seg.size
        n += 1
    return n
