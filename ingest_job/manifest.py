"""Read the segment manifest from the metadata store and plan Spark work units.

Only manifest entries are data (docs/format.md, "Object keys"): objects in the store that
no committed entry names are never read. Offsets that the manifest no longer covers
(retention) are reported as gaps and skipped, never silently.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from broker.cycles import ChainError, chain_of
from broker.meta.base import MetaStore, open_meta
from broker.meta.schema import (
    EndValue,
    SegmentMeta,
    TopicInfo,
    cycles_prefix,
    end_key,
    entry_base,
    segments_prefix,
    topic_key,
)
from ingest_job.model import Gap, IngestError, Offsets, SegmentRef, TopicPartition, WorkUnit
from ingest_job.txns import overlapping, read_txns
from segments.format import partition_prefix, segment_key

log = logging.getLogger(__name__)

DEFAULT_UNIT_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class PartitionLog:
    """A partition's committed log: its end and its segments, ascending by base."""

    topic: str
    partition: int
    next_offset: int  # the last stable offset: open transactions hold the job there
    segments: tuple[SegmentRef, ...]
    aborted: tuple[tuple[int, int, int], ...] = ()  # ingest_job.txns


@dataclass(frozen=True, slots=True)
class Plan:
    units: tuple[WorkUnit, ...]
    gaps: tuple[Gap, ...]
    ends: Offsets  # the next offset per partition once every unit is committed
    records: int  # offsets covered by the units


async def read_logs(
    meta: MetaStore, topics: Sequence[str], namespace: str = "default"
) -> list[PartitionLog]:
    """Every partition log of ``topics``; raises IngestError for an unknown topic."""
    logs: list[PartitionLog] = []
    cycles = _Cycles(meta)
    for topic in topics:
        kv = await meta.get(topic_key(topic))
        if kv is None:
            raise IngestError(f"topic {topic!r} does not exist in the metadata store")
        info = TopicInfo.from_json(topic, kv.value)
        for part in range(info.partitions):
            logs.append(await _read_partition(meta, topic, part, namespace, cycles, info))
    return logs


class _Cycles:
    """The cycle keys of each owner an end value names, read once per plan: entries
    acknowledged and not folded into the partitions' own keys yet (broker/cycles.py)."""

    def __init__(self, meta: MetaStore) -> None:
        self.meta = meta
        self.values: dict[tuple[int, int], list[bytes]] = {}

    async def chain(
        self, end: EndValue, topic: str, part: int, info: TopicInfo
    ) -> list[SegmentMeta]:
        if end.broker < 0:
            return []
        owner = (end.broker, end.reg)
        if owner not in self.values:
            kvs = await self.meta.range(cycles_prefix(end.broker, end.reg))
            self.values[owner] = [kv.value for kv in kvs]
        try:
            return chain_of(self.values[owner], end, topic, part, info.topic_id.hex)
        except ChainError as exc:
            raise IngestError(f"cannot read the unfolded entries of {topic}-{part}: {exc}") from exc


async def _read_partition(
    meta: MetaStore, topic: str, part: int, namespace: str, cycles: _Cycles, info: TopicInfo
) -> PartitionLog:
    # the end first: entries committed after it are past it, and are skipped below
    end_kv = await meta.get(end_key(topic, part))
    end = EndValue.decode(end_kv.value) if end_kv else EndValue(0, 0)
    chain = await cycles.chain(end, topic, part, info)
    next_offset = chain[-1].last + 1 if chain else end.next_offset
    lso, aborted = await read_txns(meta, topic, part)
    if lso is not None:
        next_offset = min(next_offset, lso)
    refs: list[SegmentRef] = []
    own = [
        SegmentMeta.from_json(entry_base(kv.key), kv.value)
        for kv in await meta.range(segments_prefix(topic, part))
    ]
    # folded (and maybe merged) since the chain was read: the own entries say so
    covered = max((e.last + 1 for e in own), default=0)
    by_base = {e.base: e for e in (*own, *(c for c in chain if c.base >= covered))}
    for entry in by_base.values():
        if entry.base >= next_offset:
            continue  # not committed as part of the log end yet
        refs.append(
            SegmentRef(
                topic=topic,
                partition=part,
                base=entry.base,
                last=min(entry.last, next_offset - 1),
                size=entry.size,
                records=entry.records,
                etag=entry.etag,
                key=partition_prefix(namespace, topic, part) + entry.key
                if entry.key
                else segment_key(namespace, topic, part, entry.base),
            )
        )
    refs.sort(key=lambda r: r.base)
    return PartitionLog(topic, part, next_offset, tuple(refs), aborted)


async def load_logs(
    meta_url: str, data_dir: str, prefix: str, topics: Sequence[str], namespace: str
) -> list[PartitionLog]:
    """Open the metadata store read-only, read the logs of ``topics``, close it."""
    meta = open_meta(meta_url, data_dir=data_dir, prefix=prefix, read_only=True)
    try:
        return await read_logs(meta, topics, namespace)
    finally:
        await meta.close()


def _partition_units(
    plog: PartitionLog, start: int, end: int, unit_bytes: int
) -> tuple[list[tuple[int, int, tuple[SegmentRef, ...]]], list[Gap]]:
    """Group the segments covering ``[start, end)`` into runs of at most ``unit_bytes``."""
    gaps: list[Gap] = []
    runs: list[tuple[int, int, tuple[SegmentRef, ...]]] = []
    cur: list[SegmentRef] = []
    cur_bytes = 0
    expected = start
    for seg in plog.segments:
        if seg.last < start or seg.base >= end:
            continue
        if seg.base > expected:
            gaps.append(Gap(plog.topic, plog.partition, expected, seg.base))
        expected = seg.last + 1
        if cur and cur_bytes + seg.size > unit_bytes:
            runs.append((max(start, cur[0].base), cur[-1].last + 1, tuple(cur)))
            cur, cur_bytes = [], 0
        cur.append(seg)
        cur_bytes += seg.size
    if cur:
        runs.append((max(start, cur[0].base), min(end, cur[-1].last + 1), tuple(cur)))
    if expected < end:
        gaps.append(Gap(plog.topic, plog.partition, expected, end))
    return runs, gaps


def plan_units(
    logs: Iterable[PartitionLog],
    starts: Offsets,
    max_records: int | None = None,
    unit_bytes: int = DEFAULT_UNIT_BYTES,
) -> Plan:
    """Work units covering every partition from ``starts`` (default 0) to its log end.

    ``max_records`` caps the offsets covered by this run in total, spread over the
    partitions in turn so that none starves.
    """
    logs = list(logs)
    bounds: dict[TopicPartition, tuple[int, int]] = {}
    for plog in logs:
        tp = (plog.topic, plog.partition)
        start = starts.get(tp, 0)
        if start > plog.next_offset:
            raise IngestError(
                f"{plog.topic}/{plog.partition}: the table has offsets up to {start}, "
                f"beyond the log end {plog.next_offset} (was the topic recreated?)"
            )
        bounds[tp] = (start, plog.next_offset)
    if max_records is not None:
        bounds = _cap(bounds, max_records)
    units: list[WorkUnit] = []
    gaps: list[Gap] = []
    ends: Offsets = {}
    total = 0
    for plog in logs:
        tp = (plog.topic, plog.partition)
        start, end = bounds[tp]
        ends[tp] = end
        total += end - start
        if end <= start:
            continue
        runs, part_gaps = _partition_units(plog, start, end, unit_bytes)
        gaps.extend(part_gaps)
        for run_start, run_end, segs in runs:
            aborted = overlapping(plog.aborted, run_start, run_end)
            units.append(
                WorkUnit(len(units), plog.topic, plog.partition, run_start, run_end, segs, aborted)
            )
    return Plan(tuple(units), tuple(gaps), ends, total)


def _cap(
    bounds: dict[TopicPartition, tuple[int, int]], max_records: int
) -> dict[TopicPartition, tuple[int, int]]:
    """Shrink the ranges so that they cover at most ``max_records`` offsets together."""
    remaining = max(0, max_records)
    want = {tp: max(0, end - start) for tp, (start, end) in bounds.items()}
    give = dict.fromkeys(bounds, 0)
    active = [tp for tp in sorted(bounds) if want[tp] > 0]
    while remaining > 0 and active:
        share = max(1, remaining // len(active))
        still: list[TopicPartition] = []
        for tp in active:
            take = min(share, want[tp] - give[tp], remaining)
            give[tp] += take
            remaining -= take
            if give[tp] < want[tp]:
                still.append(tp)
            if remaining == 0:
                break
        active = still
    return {tp: (start, start + give[tp]) for tp, (start, _end) in bounds.items()}


#: work units per Spark task beyond one task per core (a task's retry redoes them all)
UNITS_PER_TASK = 4


def task_groups(units: Sequence[WorkUnit], slots: int) -> list[list[WorkUnit]]:
    """The units as Spark tasks: one task per core, or more so that a task holds about
    UNITS_PER_TASK units; balanced by bytes (the largest unit into the lightest task).

    Each Spark task has a fixed cost (scheduling, the Python worker's hand-off: ~40 ms of
    CPU, and a gap between waves of tasks), so units beyond one per core run inside the
    tasks rather than as further waves (docs/benchmarks.md, "Ingest").
    """
    if not units:
        return []
    count = min(len(units), max(slots, 1, -(-len(units) // UNITS_PER_TASK)))
    groups: list[list[WorkUnit]] = [[] for _ in range(count)]
    loads = [0] * count
    for unit in sorted(units, key=lambda u: (-u.size, u.unit_id)):
        i = min(range(count), key=lambda j: (loads[j], len(groups[j])))
        groups[i].append(unit)
        loads[i] += unit.size
    return [sorted(g, key=lambda u: u.unit_id) for g in groups]
