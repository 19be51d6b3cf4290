"""The Spark task: read one work unit's segments, decode, write Parquet, report back.

Runs on executors. Reads each segment with ``If-Match`` on the manifest's ETag and
validates it whole before decoding; writes one Parquet file per destination table and
partition value (``TIMESTAMP_MICROS`` timestamps, no INT96) through pyiceberg's FileIO, so
local and S3 warehouses behave the same. Nothing is committed here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO, load_file_io

from ingest_job.decode import (
    RAW_SCHEMA,
    BatchRef,
    Columns,
    RecordDecodeError,
    decode_batches_into,
)
from ingest_job.jsonvals import ARROW_TYPES, JsonColumns, column_name, parse_json_array
from ingest_job.model import (
    CorruptInputError,
    SegmentRef,
    TaskSpec,
    UnitResult,
    WorkUnit,
    WrittenFile,
)
from ingest_job.txns import is_aborted
from segments.format import CorruptSegmentError, iter_segment_batches
from segments.store import (
    Buffer,
    ObjectNotFoundError,
    PreconditionFailedError,
    StoreError,
    open_store,
)
from segments.validate import validate_segment

log = logging.getLogger(__name__)
T = TypeVar("T")

#: environment variable naming a directory for per-task cProfile dumps
PROFILE_ENV = "KAFSCALE_INGEST_PROFILE"

PARQUET_COMPRESSION = "zstd"
DEAD_LETTER_SUFFIX = "_dead_letters"
_US_PER = {"day": 86_400_000_000, "hour": 3_600_000_000}
_TABLE_CHARS = re.compile(r"[^A-Za-z0-9_]")
_NO_DICTIONARY = frozenset({"offset", "timestamp", "value"})
_HEADER_LEAVES = {"headers": ("headers.list.element.key", "headers.list.element.value")}


def table_name_for(base: str) -> str:
    """A table name from a topic or routing value (``.``/``-``/spaces become ``_``)."""
    name = _TABLE_CHARS.sub("_", base)
    return name or "_"


def dead_letter_table(table: str) -> str:
    return table + DEAD_LETTER_SUFFIX


#: segment objects a task reads at once (the store's reads overlap their hand-offs)
FETCH_CONCURRENCY = 4


async def _fetch(store_url: str, segs: tuple[SegmentRef, ...], out: list[Buffer]) -> None:
    """Fill ``out`` with the segments' bytes, in order (up to FETCH_CONCURRENCY reads at
    once), through the store's read-path ``get_buffer`` where it has one (the local store
    maps the file's pages instead of copying them: docs/benchmarks.md, "Ingest").

    The bytes are not the coroutine's result on purpose: in a Spark worker (main thread)
    ``asyncio.run`` looks up the SIGINT handler it installed, a partial holding the done
    task, and Python's signal module builds (and throws away) the task's repr, result
    included: a full ``repr`` of every segment, which cost half of the task's time.
    """
    store = open_store(store_url)
    get = getattr(store, "get_buffer", store.get)
    slots: list[Buffer] = [b""] * len(segs)
    gate = asyncio.Semaphore(FETCH_CONCURRENCY)

    async def one(i: int, seg: SegmentRef) -> None:
        async with gate:
            slots[i] = await _get_segment(get, seg)

    try:
        done = await asyncio.gather(
            *(one(i, seg) for i, seg in enumerate(segs)), return_exceptions=True
        )
    finally:
        await store.close()
    for res in done:  # every read has ended: the first failure, in segment order
        if isinstance(res, BaseException):
            raise res
    out.extend(slots)


async def _get_segment(get: Callable[..., Awaitable[Buffer]], seg: SegmentRef) -> Buffer:
    try:
        data = await get(seg.key, if_match=seg.etag or None)
    except ObjectNotFoundError as exc:
        raise CorruptInputError(
            f"segment object {seg.key} ({seg.topic}/{seg.partition} offsets "
            f"{seg.base}..{seg.last}) named by the manifest is missing"
        ) from exc
    except PreconditionFailedError as exc:
        raise CorruptInputError(
            f"segment object {seg.key} ({seg.topic}/{seg.partition} offsets "
            f"{seg.base}..{seg.last}) does not match its manifest ETag {seg.etag}"
        ) from exc
    except StoreError as exc:
        raise CorruptInputError(f"cannot read segment object {seg.key}: {exc}") from exc
    return data


def decode_unit(unit: WorkUnit, datas: list[Buffer]) -> Columns:
    """Validate every segment of ``unit`` and decode its records in ``[start, end)``.

    All segments' batches go to the decoder in one call: one Arrow chunk per unit, which
    Parquet writes faster than many small ones.
    """
    per_segment: list[tuple[str, list[BatchRef]]] = []
    for seg, data in zip(unit.segments, datas, strict=True):
        where = f"segment {seg.key} ({seg.topic}/{seg.partition} offsets {seg.base}..{seg.last})"
        report = validate_segment(data)
        if not report.ok:
            raise CorruptInputError(f"corrupt {where}: {'; '.join(report.problems[:3])}")
        try:
            wanted = [
                (hdr, view)
                for _pos, hdr, view in iter_segment_batches(data)
                if hdr.last_offset >= unit.start
                and hdr.base_offset < unit.end
                and not is_aborted(hdr, unit.aborted)
            ]
        except CorruptSegmentError as exc:
            raise CorruptInputError(f"corrupt {where}: {exc}") from exc
        per_segment.append((where, wanted))
    cols = Columns(unit.topic, unit.partition)
    try:
        decode_batches_into(cols, [b for _w, bs in per_segment for b in bs], unit.start, unit.end)
    except RecordDecodeError:
        for where, wanted in per_segment:  # name the segment at fault
            try:
                decode_batches_into(Columns(unit.topic, unit.partition), wanted, 0, 0)
            except RecordDecodeError as exc:
                raise CorruptInputError(f"corrupt {where}: {exc}") from exc
        raise
    return cols


def read_unit(store_url: str, unit: WorkUnit) -> Columns:
    """Fetch, validate and decode one work unit (the ``kafs`` data source uses it too)."""
    datas: list[Buffer] = []
    asyncio.run(_fetch(store_url, unit.segments, datas))
    return decode_unit(unit, datas)


def _partition_groups(tbl: pa.Table, partition_by: str) -> Iterator[tuple[str, pa.Table]]:
    """(partition directory, rows) groups, one per day/hour value of ``timestamp``."""
    if partition_by == "none" or tbl.num_rows == 0:
        yield "", tbl
        return
    unit = _US_PER[partition_by]
    keys = pc.divide(tbl.column("timestamp").cast(pa.int64()), unit)
    for key in pc.unique(keys).to_pylist():
        when = datetime.fromtimestamp(key * unit / 1e6, UTC)
        label = when.strftime("%Y-%m-%d") if partition_by == "day" else when.strftime("%Y-%m-%d-%H")
        yield f"timestamp_{partition_by}={label}/", tbl.filter(pc.equal(keys, key))


def write_parquet(io: FileIO, path: str, tbl: pa.Table) -> int:
    """Write ``tbl`` at ``path`` (fails if it exists); returns the file size."""
    out = io.new_output(path)
    with out.create(overwrite=False) as stream:
        pq.write_table(tbl, stream, **parquet_options(tbl.schema))
    return len(io.new_input(path))


def parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """``pq.write_table`` options: zstd, µs timestamps, and dictionary encoding except for
    columns that are unique per record (offset, timestamp) or usually so (value), where
    trying a dictionary first only costs time (measured: ~35% of the write, larger files).
    """
    return {
        "compression": PARQUET_COMPRESSION,
        "coerce_timestamps": "us",
        "use_deprecated_int96_timestamps": False,
        "use_dictionary": [
            leaf
            for name in schema.names
            if name not in _NO_DICTIONARY
            for leaf in _HEADER_LEAVES.get(name, (name,))
        ],
    }


class _Writer:
    """Writes one unit's output files, numbering them."""

    def __init__(self, spec: TaskSpec, unit: WorkUnit, attempt: int) -> None:
        self.spec = spec
        self.unit = unit
        self.attempt = attempt
        self.io = load_file_io(dict(spec.io_properties))
        self.files: list[WrittenFile] = []

    def write(self, table: str, tbl: pa.Table, fields: tuple[tuple[str, str], ...]) -> None:
        if tbl.num_rows == 0:
            return
        location = table_location(self.spec, table)
        for pdir, part in _partition_groups(tbl, self.spec.partition_by):
            n = len(self.files)
            path = (
                f"{location}/data/{pdir}kafscale-{self.spec.run_id}-"
                f"u{self.unit.unit_id:05d}-a{self.attempt}-{n:03d}.parquet"
            )
            size = write_parquet(self.io, path, part)
            self.files.append(WrittenFile(table, path, part.num_rows, size, fields))


def dest_start(spec: TaskSpec, table: str, tp: tuple[str, int]) -> int:
    dest = spec.destination(table)
    return dest.start_of(tp) if dest else 0


def table_location(spec: TaskSpec, table: str) -> str:
    """A destination's location; a routed table not created yet goes beside the first."""
    dest = spec.destination(table)
    if dest is not None:
        return dest.location
    return f"{spec.destinations[0].location.rsplit('/', 1)[0]}/{table}"


def routed_table(base: str, value: object) -> str:
    """The table a record goes to when routed by a field value (``{base}_{value}``)."""
    if value is None or value == "":
        return base
    return f"{base}_{table_name_for(str(value)).lower()}"


def _since(tbl: pa.Table, start: int) -> pa.Table:
    if start <= 0 or tbl.num_rows == 0 or pc.min(tbl.column("offset")).as_py() >= start:
        return tbl
    return tbl.filter(pc.greater_equal(tbl.column("offset"), start))


def _dead_letter_rows(raw: pa.Table, js: JsonColumns) -> pa.Table:
    idx = pa.array([i for i, _ in js.dead], pa.int64())
    dead = raw.take(idx).drop_columns(["headers"])
    return dead.append_column("error", pa.array([r for _, r in js.dead], pa.string()))


def _json_tables(
    spec: TaskSpec, raw: pa.Table, table: str
) -> tuple[pa.Table, pa.Table, JsonColumns]:
    dest = spec.destination(table)
    known = dict(dest.known_fields) if dest else {}
    js = parse_json_array(raw.column("value"), raw.column("offset"), known)
    good = raw if len(js.rows) == raw.num_rows else raw.take(pa.array(js.rows, pa.int64()))
    for name, arr in js.arrays():
        good = good.append_column(name, arr)
    return good, _dead_letter_rows(raw, js), js


def _json_rows(spec: TaskSpec, src: pa.Table, base: str) -> tuple[pa.Table, pa.Table, JsonColumns]:
    """JSON rows (with the upsert op column under --upsert-key / --cdc), dead letters."""
    if spec.cdc:
        from ingest_job.upsert import json_cdc_rows

        def tables(unwrapped: pa.Table, original: pa.Array) -> tuple[pa.Table, pa.Table, Any]:
            good, dead, js = _json_tables(spec, unwrapped, base)
            vi = good.schema.get_field_index("value")
            good = good.set_column(vi, "value", original.take(pa.array(js.rows, pa.int64())))
            dead_idx = pa.array([i for i, _ in js.dead], pa.int64())
            dead = dead.set_column(vi, "value", original.take(dead_idx))
            return good, dead, js

        return json_cdc_rows(src, tables)
    good, dead, js = _json_tables(spec, src, base)
    if spec.upsert:
        from ingest_job.upsert import key_ops, with_ops

        good = with_ops(good, key_ops(good, spec.upsert))
    return good, dead, js


def _json_fields(tbl: pa.Table) -> tuple[tuple[str, str], ...]:
    """(name, type) of the JSON columns of ``tbl`` that hold at least one value."""
    kinds = {v: k for k, v in ARROW_TYPES.items()}
    out = []
    for name in tbl.column_names[len(RAW_SCHEMA) :]:
        col = tbl.column(name)
        if col.null_count < len(col):
            out.append((name, kinds[col.type]))
    return tuple(sorted(out))


def _write_routed(
    spec: TaskSpec, raw: pa.Table, base: str, tp: tuple[str, int], writer: _Writer
) -> tuple[int, list[str]]:
    """JSON records to ``{base}_{value of spec.route_by}`` tables; returns (dead, conflicts)."""
    assert spec.route_by is not None
    good, dead, js = _json_tables(spec, raw, base)
    dl = dead_letter_table(base)
    dead = _since(dead, dest_start(spec, dl, tp))
    writer.write(dl, dead, ())
    field_col = column_name(spec.route_by)
    keys = (
        good.column(field_col).to_pylist()
        if field_col in good.column_names
        else [None] * good.num_rows
    )
    groups: dict[str, list[int]] = {}
    for i, val in enumerate(keys):
        groups.setdefault(routed_table(base, val), []).append(i)
    for table, rows in sorted(groups.items()):
        part = _since(good.take(pa.array(rows, pa.int64())), dest_start(spec, table, tp))
        fields = _json_fields(part)
        keep = list(RAW_SCHEMA.names) + [n for n, _k in fields]
        writer.write(table, part.select(keep), fields)
    return dead.num_rows, js.conflicts


def _write_typed(
    spec: TaskSpec, raw: pa.Table, base: str, tp: tuple[str, int], writer: _Writer
) -> int:
    """Registry-typed values (ingest_job/typed.py); returns the dead-letter count."""
    from ingest_job.typed import typed_tables

    dl = dead_letter_table(base)
    s_main, s_dead = dest_start(spec, base, tp), dest_start(spec, dl, tp)
    good, dead = typed_tables(spec.typed, _since(raw, min(s_main, s_dead)), base)
    writer.write(base, _since(good, s_main), ())
    dead = _since(dead, s_dead)
    writer.write(dl, dead, ())
    return dead.num_rows


def profiled(name: str, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, under cProfile when ``$KAFSCALE_INGEST_PROFILE`` names a directory
    (stats dumped to ``<dir>/<name>-<pid>.prof``; for profiling Spark's Python workers)."""
    out_dir = os.environ.get(PROFILE_ENV)
    if not out_dir:
        return fn(*args)
    import cProfile

    prof = cProfile.Profile()
    try:
        return prof.runcall(fn, *args)
    finally:
        prof.dump_stats(os.path.join(out_dir, f"{name}-{os.getpid()}.prof"))


def run_unit(spec: TaskSpec, unit: WorkUnit, attempt: int = 0) -> UnitResult:
    """Decode one unit and write its files; returns what the driver needs to commit.

    ``attempt`` (Spark's task attempt number) keeps retried or speculative attempts of the
    same unit from writing the same paths.
    """
    return profiled(f"unit-{unit.unit_id:05d}-a{attempt}", _run_unit, spec, unit, attempt)


def _run_unit(spec: TaskSpec, unit: WorkUnit, attempt: int) -> UnitResult:
    cols = read_unit(spec.store_url, unit)
    raw = cols.to_table()
    base = spec.table or table_name_for(unit.topic)
    writer = _Writer(spec, unit, attempt)
    tp = (unit.topic, unit.partition)
    dead_count = 0
    conflicts: list[str] = []
    if spec.value_format == "raw" and spec.upsert:
        from ingest_job.upsert import key_ops, with_ops

        rows = _since(raw, dest_start(spec, base, tp))
        writer.write(base, with_ops(rows, key_ops(rows, spec.upsert)), ())
    elif spec.value_format == "raw":
        writer.write(base, _since(raw, dest_start(spec, base, tp)), ())
    elif spec.typed is not None:
        dead_count = _write_typed(spec, raw, base, tp, writer)
    elif spec.route_by:
        dead_count, found = _write_routed(spec, raw, base, tp, writer)
        conflicts.extend(f"{unit.topic}/{unit.partition}: {c}" for c in found)
    else:
        dl = dead_letter_table(base)
        dl_dest = spec.destination(dl)
        s_main = dest_start(spec, base, tp)
        s_dead = dl_dest.start_of(tp) if dl_dest else 0
        good, dead, js = _json_rows(spec, _since(raw, min(s_main, s_dead)), base)
        fields = tuple(sorted(js.kinds().items()))
        writer.write(base, _since(good, s_main), fields)
        conflicts.extend(f"{unit.topic}/{unit.partition}: {c}" for c in js.conflicts)
        dead = _since(dead, s_dead)
        dead_count = dead.num_rows
        writer.write(dl, dead, ())
    return UnitResult(
        unit_id=unit.unit_id,
        topic=unit.topic,
        partition=unit.partition,
        records=len(cols),
        segment_bytes=unit.size,
        files=tuple(writer.files),
        dead_letters=dead_count,
        conflicts=tuple(conflicts),
        newest_ms=_newest_ms(raw),
    )


def _newest_ms(raw: pa.Table) -> int:
    if raw.num_rows == 0:
        return -1
    newest = pc.max(raw.column("timestamp").cast(pa.int64())).as_py()
    return -1 if newest is None else int(newest) // 1000
