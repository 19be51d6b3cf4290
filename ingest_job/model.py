"""Values passed between the ingest driver and its Spark tasks (all picklable)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

#: snapshot summary property carrying ``{"topic": {"partition": next_offset}}``
OFFSETS_PROPERTY = "kafscale.offsets"
#: snapshot summary property: newest record timestamp (ms) of the commit (freshness)
NEWEST_PROPERTY = "kafscale.newest-ms"

TopicPartition = tuple[str, int]
#: committed positions: (topic, partition) -> next offset to read
Offsets = dict[TopicPartition, int]


class IngestError(Exception):
    """A failure the job reports to the user (no commit happened for what it names)."""


class CorruptInputError(IngestError):
    """A segment that is corrupt, truncated, missing or replaced (names the object)."""


def offsets_to_json(offsets: Offsets) -> str:
    out: dict[str, dict[str, int]] = {}
    for (topic, part), nxt in sorted(offsets.items()):
        out.setdefault(topic, {})[str(part)] = nxt
    return json.dumps(out, sort_keys=True, separators=(",", ":"))


def offsets_from_json(text: str) -> Offsets:
    raw = json.loads(text)
    return {(t, int(p)): int(n) for t, parts in raw.items() for p, n in parts.items()}


@dataclass(frozen=True, slots=True)
class SegmentRef:
    """One committed segment, as its manifest entry names it."""

    topic: str
    partition: int
    base: int
    last: int
    size: int
    records: int
    etag: str
    key: str


@dataclass(frozen=True, slots=True)
class Gap:
    """Offsets ``[start, end)`` of a partition that no committed segment holds any more."""

    topic: str
    partition: int
    start: int
    end: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition} offsets {self.start}..{self.end - 1}"


@dataclass(frozen=True, slots=True)
class WorkUnit:
    """Consecutive segments of one partition, offsets ``[start, end)``: one output file set;
    one or more units make a Spark task (``ingest_job.manifest.task_groups``)."""

    unit_id: int
    topic: str
    partition: int
    start: int
    end: int
    segments: tuple[SegmentRef, ...]
    # aborted transactions overlapping the unit: (producer id, first, marker offset)
    aborted: tuple[tuple[int, int, int], ...] = ()

    @property
    def size(self) -> int:
        return sum(s.size for s in self.segments)


@dataclass(frozen=True, slots=True)
class Destination:
    """A table records go to, with the next offset it has committed per partition."""

    name: str  # table name inside the namespace
    location: str  # table location (files go to {location}/data/)
    starts: tuple[tuple[TopicPartition, int], ...]
    # JSON field name -> type name ("long", "double", "boolean", "string")
    known_fields: tuple[tuple[str, str], ...] = ()

    def start_of(self, tp: TopicPartition) -> int:
        for key, val in self.starts:
            if key == tp:
                return val
        return 0


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """Everything a task needs besides its unit (broadcast to every task)."""

    run_id: str
    store_url: str
    value_format: str  # "raw" | "json" | "avro" | "protobuf" | "json-schema"
    partition_by: str  # "day" | "hour" | "none"
    table_per_topic: bool
    table: str | None
    route_by: str | None
    io_properties: tuple[tuple[str, str], ...]
    destinations: tuple[Destination, ...]
    typed: Any = None  # ingest_job.typed.TypedSpec for avro | protobuf | json-schema
    upsert: tuple[str, ...] = ()  # --upsert-key columns (ingest_job/upsert.py)
    cdc: str | None = None  # --cdc debezium

    def destination(self, name: str) -> Destination | None:
        for d in self.destinations:
            if d.name == name:
                return d
        return None


@dataclass(frozen=True, slots=True)
class WrittenFile:
    table: str
    path: str
    records: int
    size: int
    # JSON columns in this file: name -> type name
    fields: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class UnitResult:
    unit_id: int
    topic: str
    partition: int
    records: int  # records decoded
    segment_bytes: int
    files: tuple[WrittenFile, ...]
    dead_letters: int = 0
    conflicts: tuple[str, ...] = ()
    # tables that received no file but exist in the route set (routing)
    tables_seen: tuple[str, ...] = field(default=())
    newest_ms: int = -1  # newest record timestamp (ms) the unit wrote (freshness)
