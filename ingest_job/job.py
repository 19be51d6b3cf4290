"""The ingest driver: plan from the manifest, run Spark tasks, commit each table once.

1. Open the catalog, make sure every destination table exists, read each table's
   committed offsets (``kafscale.offsets`` of its newest snapshot carrying them).
2. Read the manifest (read-only) and plan work units from the smallest committed offset.
3. Spark tasks decode segments and write Parquet; they return paths and counts.
4. Per table: reload, re-check its offsets, ``add_files`` with the new offsets in one
   snapshot (retries off). A run that fails before step 4 commits nothing and deletes
   the files it wrote; files a killed run leaves behind are orphans for ``maintain``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyiceberg.catalog import Catalog
from pyiceberg.io import load_file_io

from ingest_job import catalog as cat
from ingest_job.files import list_files
from ingest_job.manifest import DEFAULT_UNIT_BYTES, Plan, load_logs, plan_units, task_groups
from ingest_job.model import (
    NEWEST_PROPERTY,
    Destination,
    Gap,
    IngestError,
    Offsets,
    TaskSpec,
    TopicPartition,
    UnitResult,
    WorkUnit,
    WrittenFile,
)
from ingest_job.task import dead_letter_table, run_unit, table_name_for
from ingest_job.worker_setup import freeze_heap, tune_allocator

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class IngestConfig:
    topics: tuple[str, ...]
    store_url: str = "file://./data"
    meta_url: str = "embedded"
    data_dir: str = "./data"
    meta_prefix: str = "/kafscale"
    segment_namespace: str = "default"
    catalog: str | None = None
    namespace: str = "kafscale"
    table: str | None = None  # one table for every topic (else one table per topic)
    route_by: str | None = None  # JSON field whose value picks the table ({base}_{value})
    value_format: str = "raw"
    partition_by: str = "day"
    max_records: int | None = None
    master: str | None = None
    unit_bytes: int = DEFAULT_UNIT_BYTES
    progress_interval: float = 10.0
    upsert_key: tuple[str, ...] = ()  # latest row per key (ingest_job/upsert.py)
    cdc: str | None = None  # "debezium": unwrap change events, deletes remove rows
    key_format: str = "raw"  # avro | protobuf | json-schema: key_<field> columns


@dataclass(slots=True)
class IngestSummary:
    run_id: str
    records: int = 0  # records decoded
    rows: int = 0  # rows committed (all tables)
    files: int = 0
    bytes: int = 0  # Parquet bytes committed
    segment_bytes: int = 0
    segments: int = 0
    dead_letters: int = 0
    seconds: float = 0.0
    offsets: dict[str, Offsets] = field(default_factory=dict)  # table -> new offsets
    gaps: list[Gap] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # tables a concurrent run committed
    # the run report (ingest_job/report.py): seconds per phase; table -> (rows, files,
    # bytes) committed; committed log ends when planned; every table's committed offsets
    # after the run; the newest record timestamp (ms) per table; when the run finished
    phases: dict[str, float] = field(default_factory=dict)
    tables: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    log_ends: Offsets = field(default_factory=dict)
    table_offsets: dict[str, Offsets] = field(default_factory=dict)
    newest_ms: dict[str, int | None] = field(default_factory=dict)
    finished_ms: int = 0
    run_newest_ms: int = -1  # newest record timestamp (ms) this run committed (freshness)

    def lines(self) -> list[str]:
        rate = self.records / self.seconds if self.seconds > 0 else 0.0
        out = [
            f"ingest {self.run_id}: {self.records} records from {self.segments} segments "
            f"({self.segment_bytes / 1e6:.1f} MB) in {self.seconds:.1f}s ({rate:,.0f} rec/s); "
            f"committed {self.rows} rows in {self.files} files ({self.bytes / 1e6:.1f} MB), "
            f"{self.dead_letters} dead letters"
        ]
        for table, offs in sorted(self.offsets.items()):
            parts = ", ".join(f"{t}/{p}->{n}" for (t, p), n in sorted(offs.items()))
            out.append(f"  {table}: next offsets {parts}")
        out += [f"  GAP (lost to retention): {g}" for g in self.gaps]
        out += [f"  type conflict: {c}" for c in self.conflicts]
        out += [f"  skipped: {s}" for s in self.skipped]
        return out


@dataclass(frozen=True, slots=True)
class _Target:
    name: str
    dead_letter: bool
    sources: tuple[TopicPartition, ...]
    route: str | None = None  # routing group of a routed table


def _targets(catalog: Catalog, cfg: IngestConfig, tps: Sequence[TopicPartition]) -> list[_Target]:
    groups: dict[str, list[TopicPartition]] = {}
    for tp in tps:
        groups.setdefault(cfg.table or table_name_for(tp[0]), []).append(tp)
    out: list[_Target] = []
    for name, srcs in groups.items():
        out.append(_Target(name, False, tuple(srcs)))
        if cfg.value_format != "raw":
            out.append(_Target(dead_letter_table(name), True, tuple(srcs)))
        if cfg.route_by:
            route = f"{name}:{cfg.route_by}"
            for routed in cat.routed_tables(catalog, cfg.namespace, route):
                out.append(_Target(routed, False, tuple(srcs), route))
    return out


def _new_routed_targets(
    catalog: Catalog,
    cfg: IngestConfig,
    targets: list[_Target],
    planned: dict[str, Offsets],
    results: Sequence[UnitResult],
) -> None:
    """Create the tables routing found values for in this run (before any commit)."""
    known = {t.name for t in targets}
    bases = {t.name: t for t in targets if not t.dead_letter and t.route is None}
    first = catalog.load_table((cfg.namespace, targets[0].name)).location()
    for r in results:
        for f in r.files:
            if f.table in known:
                continue
            base = cfg.table or table_name_for(r.topic)
            location = f"{first.rsplit('/', 1)[0]}/{f.table}"
            route = f"{base}:{cfg.route_by}"
            cat.ensure_table(
                catalog, cfg.namespace, f.table, cfg.partition_by,
                location=location, properties={cat.ROUTE_PROPERTY: route},
            )  # fmt: skip
            targets.append(_Target(f.table, False, bases[base].sources, route))
            planned[f.table] = {}
            known.add(f.table)


def _error_text(exc: BaseException) -> str:
    """The user-facing message of a failure inside a Spark task."""
    text = str(exc)
    found = re.findall(r"(?:CorruptInputError|IngestError): ([^\n]+)", text)
    return found[-1] if found else text.strip().splitlines()[-1] if text.strip() else repr(exc)


class _Progress:
    def __init__(self, total_units: int, total_bytes: int, interval: float) -> None:
        self.total_units = total_units
        self.total_bytes = total_bytes
        self.interval = interval
        self.started = time.monotonic()

    def line(self, units: int, records: int, nbytes: int) -> str:
        secs = max(time.monotonic() - self.started, 1e-9)
        return (
            f"progress: {units}/{self.total_units} units, {records} records, "
            f"{nbytes / 1e6:.1f}/{self.total_bytes / 1e6:.1f} MB, "
            f"{records / secs:,.0f} rec/s, {nbytes / secs / 1e6:.1f} MB/s"
        )


def _run_spark(
    spark: SparkSession,
    spec: TaskSpec,
    units: Sequence[WorkUnit],
    interval: float,
    say: Callable[[str], None],
) -> list[UnitResult]:
    sc = spark.sparkContext
    spec_b = sc.broadcast(spec)
    acc_records = sc.accumulator(0)
    acc_bytes = sc.accumulator(0)
    acc_units = sc.accumulator(0)

    def task(group: list[WorkUnit]) -> list[UnitResult]:
        from pyspark import TaskContext

        tune_allocator()
        ctx = TaskContext.get()
        out = []
        for unit in group:
            res = run_unit(spec_b.value, unit, ctx.attemptNumber() if ctx else 0)
            acc_records.add(res.records)
            acc_bytes.add(res.segment_bytes)
            acc_units.add(1)
            out.append(res)
        freeze_heap()
        return out

    box: dict[str, Any] = {}
    groups = task_groups(units, sc.defaultParallelism)

    def collect() -> None:
        try:
            found = sc.parallelize(groups, len(groups)).map(task).collect()
            box["results"] = sorted((r for rs in found for r in rs), key=lambda r: r.unit_id)
        except BaseException as exc:  # re-raised on the driver thread below
            box["error"] = exc

    progress = _Progress(len(units), sum(u.size for u in units), interval)
    worker = threading.Thread(target=collect, name="kafscale-ingest-spark", daemon=True)
    worker.start()
    while True:
        worker.join(timeout=interval)
        if not worker.is_alive():
            break
        say(progress.line(acc_units.value, acc_records.value, acc_bytes.value))
    spec_b.unpersist()
    if "error" in box:
        raise IngestError(_error_text(box["error"])) from box["error"]
    results: list[UnitResult] = box["results"]
    say(progress.line(len(results), sum(r.records for r in results), progress.total_bytes))
    return results


def _cleanup_run(catalog: Catalog, cfg: IngestConfig, names: Sequence[str], run_id: str) -> None:
    """Delete every file this run wrote (best effort; the rest are orphans)."""
    for name in names:
        try:
            tbl = catalog.load_table((cfg.namespace, name))
            for path, _mtime in list_files(tbl.io, f"{tbl.location()}/data"):
                if f"kafscale-{run_id}-" in path:
                    tbl.io.delete(path)
        except Exception as exc:  # cleanup must not hide the original error
            log.warning("cleanup of run %s in %s failed: %s", run_id, name, exc)


def _load_plan(cfg: IngestConfig) -> tuple[list[TopicPartition], Any]:
    try:
        logs = asyncio.run(
            load_logs(
                cfg.meta_url, cfg.data_dir, cfg.meta_prefix, cfg.topics, cfg.segment_namespace
            )
        )
    except IngestError:
        raise
    except Exception as exc:
        raise IngestError(f"cannot read the segment manifest from {cfg.meta_url}: {exc}") from exc
    return [(lg.topic, lg.partition) for lg in logs], logs


def _prepare_tables(
    catalog: Catalog, cfg: IngestConfig, targets: Sequence[_Target]
) -> tuple[dict[str, Offsets], list[Destination], Offsets]:
    """Create missing tables; (offsets per table, task destinations, scan starts)."""
    planned: dict[str, Offsets] = {}
    dests: list[Destination] = []
    starts: Offsets = {}
    for t in targets:
        tbl = cat.ensure_table(catalog, cfg.namespace, t.name, cfg.partition_by, t.dead_letter)
        offs = cat.table_offsets(tbl)
        planned[t.name] = offs
        known = () if t.dead_letter else tuple(sorted(cat.json_fields(tbl).items()))
        table_starts = tuple((tp, offs.get(tp, 0)) for tp in t.sources)
        dests.append(Destination(t.name, tbl.location(), table_starts, known))
        for tp, cur in table_starts:
            starts[tp] = min(starts.get(tp, cur), cur)
    return planned, dests, starts


def _typed_spec(catalog: Catalog, cfg: IngestConfig, targets: Sequence[_Target]) -> Any:
    """Evolve typed tables to their registry subjects (None unless a typed format)."""
    from ingest_job.typed import TYPED_FORMATS, load_registry, prepare_typed

    if cfg.value_format not in TYPED_FORMATS:
        return None
    snap = load_registry(cfg.meta_url, cfg.data_dir, cfg.meta_prefix, cfg.topics)
    tables = [(t.name, sorted({tp[0] for tp in t.sources})) for t in targets if not t.dead_letter]
    return prepare_typed(
        catalog, cfg.namespace, cfg.value_format, snap, tables, cat.base_schema().column_names,
        cfg.cdc, cfg.upsert_key, None if cfg.key_format == "raw" else cfg.key_format,
    )  # fmt: skip


def _check_flags(cfg: IngestConfig) -> None:
    if cfg.route_by and cfg.value_format != "json":
        raise IngestError("--route-by needs --value-format json")
    if cfg.cdc and (cfg.value_format == "raw" or not cfg.upsert_key):
        raise IngestError("--cdc debezium needs a value format and --upsert-key (the row's key)")
    if cfg.key_format != "raw" and cfg.value_format in ("raw", "json"):
        raise IngestError("--key-format needs --value-format avro, protobuf or json-schema")
    if cfg.upsert_key and cfg.route_by:
        raise IngestError("--upsert-key and --route-by exclude each other")


def run_ingest(
    cfg: IngestConfig,
    spark: SparkSession | None = None,
    say: Callable[[str], None] | None = None,
) -> IngestSummary:
    """One ingest run; raises IngestError (with nothing committed for the failing step)."""
    emit = say or (lambda s: log.info("%s", s))
    started = time.monotonic()
    run_id = uuid.uuid4().hex[:12]
    summary = IngestSummary(run_id)
    catalog = cat.open_catalog(cfg.catalog, cfg.data_dir)
    cat.ensure_namespace(catalog, cfg.namespace)
    tps, logs = _load_plan(cfg)
    summary.log_ends = {(lg.topic, lg.partition): lg.next_offset for lg in logs}
    _check_flags(cfg)
    targets = _targets(catalog, cfg, tps)
    planned, dests, starts = _prepare_tables(catalog, cfg, targets)
    plan: Plan = plan_units(logs, starts, cfg.max_records, cfg.unit_bytes)
    summary.gaps = list(plan.gaps)
    for g in plan.gaps:
        log.warning("gap: %s are no longer in any committed segment (retention)", g)
    summary.segments = sum(len(u.segments) for u in plan.units)
    emit(
        f"ingest {run_id}: {len(plan.units)} units, {summary.segments} segments, "
        f"{plan.records} offsets from {len(tps)} partitions into {len(targets)} tables"
    )
    results: list[UnitResult] = []
    summary.phases["plan"] = time.monotonic() - started
    if plan.units:
        spec = TaskSpec(
            run_id=run_id,
            store_url=cfg.store_url,
            value_format=cfg.value_format,
            partition_by=cfg.partition_by,
            table_per_topic=cfg.table is None,
            table=cfg.table,
            route_by=cfg.route_by,
            io_properties=tuple(sorted((k, str(v)) for k, v in catalog.properties.items())),
            destinations=tuple(dests),
            typed=_typed_spec(catalog, cfg, targets),
            upsert=cfg.upsert_key,
            cdc=cfg.cdc,
        )
        from ingest_job.spark import get_spark

        session = spark or get_spark(cfg.master)
        try:
            results = _run_spark(session, spec, plan.units, cfg.progress_interval, emit)
        except BaseException:
            _cleanup_run(catalog, cfg, [t.name for t in targets], run_id)
            raise
    summary.phases["spark"] = time.monotonic() - started - summary.phases["plan"]
    if cfg.route_by:
        _new_routed_targets(catalog, cfg, targets, planned, results)
    committing = time.monotonic()
    _commit_all(catalog, cfg, targets, planned, plan.ends, results, summary, emit)
    _record_tables(catalog, cfg, targets, planned, summary)
    summary.phases["commit"] = time.monotonic() - committing
    summary.seconds = time.monotonic() - started
    summary.finished_ms = int(time.time() * 1000)
    return summary


def _record_tables(
    catalog: Catalog,
    cfg: IngestConfig,
    targets: Sequence[_Target],
    planned: dict[str, Offsets],
    summary: IngestSummary,
) -> None:
    """Each table's committed offsets after the run and its newest record (the report)."""
    from ingest_job.report import newest_timestamp_ms

    for t in targets:
        name = f"{cfg.namespace}.{t.name}"  # as in summary.offsets
        offs = summary.offsets.get(name, planned.get(t.name, {}))
        summary.table_offsets[name] = {tp: offs.get(tp, 0) for tp in t.sources}
        try:
            tbl = catalog.load_table((cfg.namespace, t.name))
            summary.newest_ms[name] = newest_timestamp_ms(tbl)
        except Exception as exc:  # the report must not fail a committed run
            log.warning("freshness of %s not read: %s", name, exc)
            summary.newest_ms[name] = None


def _fold(
    catalog: Catalog, cfg: IngestConfig, table: str, files: list[WrittenFile], run_id: str
) -> tuple[list[WrittenFile], Callable[[Any], None]]:
    """Upsert tables: the run's files folded to the newest row per key, and the staging
    of the touched keys' deletes (ingest_job/upsert.py)."""
    from ingest_job.upsert import fold_files, stage_deletes

    tbl = catalog.load_table((cfg.namespace, table))
    folded, keys = fold_files(
        tbl.io, files, cfg.upsert_key, tbl.location(), run_id, cfg.partition_by
    )
    return folded, lambda tx: stage_deletes(tx, keys)


def _commit_all(
    catalog: Catalog,
    cfg: IngestConfig,
    targets: Sequence[_Target],
    planned: dict[str, Offsets],
    ends: Offsets,
    results: Sequence[UnitResult],
    summary: IngestSummary,
    emit: Callable[[str], None],
) -> None:
    by_table: dict[str, list[WrittenFile]] = {}
    for r in results:
        summary.records += r.records
        summary.segment_bytes += r.segment_bytes
        summary.dead_letters += r.dead_letters
        summary.conflicts.extend(r.conflicts)
        for f in r.files:
            by_table.setdefault(f.table, []).append(f)
    done: set[str] = set()
    for t in targets:
        files = by_table.get(t.name, [])
        before = planned[t.name]
        new = {tp: max(before.get(tp, 0), ends[tp]) for tp in t.sources if tp in ends}
        if not files and all(before.get(tp, 0) == n for tp, n in new.items()):
            continue
        try:
            stage = None
            if cfg.upsert_key and not t.dead_letter and files:
                files, stage = _fold(catalog, cfg, t.name, files, summary.run_id)
            newest = max([-1, *(r.newest_ms for r in results if (r.topic, r.partition) in new)])
            props = {NEWEST_PROPERTY: str(newest)} if newest >= 0 else None
            res = cat.commit_files(
                catalog, (cfg.namespace, t.name), before, new, files, stage, props
            )
        except cat.ConcurrentRunError as exc:
            log.warning("%s", exc)
            summary.skipped.append(str(exc))
            continue
        except Exception as exc:
            left = [f.path for name, fs in by_table.items() if name not in done for f in fs]
            cat.delete_files(load_file_io(dict(catalog.properties)), left)
            raise IngestError(f"commit to {cfg.namespace}.{t.name} failed: {exc}") from exc
        done.add(t.name)
        summary.run_newest_ms = max(summary.run_newest_ms, newest)
        summary.rows += res.records
        summary.files += res.files
        summary.bytes += res.bytes
        summary.offsets[res.table] = new
        summary.tables[res.table] = (res.records, res.files, res.bytes)
        emit(f"committed {res.records} rows in {res.files} files to {res.table}")
