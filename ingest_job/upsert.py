"""Upserts and change streams (``--upsert-key``, ``--cdc debezium``), docs/ingest.md.

Tasks write their rows with an extra column :data:`OP_COLUMN` (``u`` upsert, ``d``
delete). At commit the driver folds one table's new files into one: the newest record per
key wins (ordered by timestamp, then partition and offset), deletes are dropped, and the
commit is one transaction that deletes the touched keys' old rows (copy-on-write: the
data files holding them are rewritten, vectorized with ``is_in`` for one key column,
through pyiceberg's ``delete`` for composite keys) and adds the folded file with the
offsets, as every other commit of the job. pyiceberg writes no equality deletes (and its
``delete`` with ``write.delete.mode=merge-on-read`` falls back to copy-on-write), so
merge-on-read is not available to this job; copy-on-write also keeps every reader
(pyiceberg, DuckDB, Spark) exact without delete-file support.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import uuid
import warnings
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.expressions import And, BooleanExpression, EqualTo, In, Or
from pyiceberg.io import FileIO

from ingest_job.jsonvals import merge_kinds
from ingest_job.model import IngestError, WrittenFile

log = logging.getLogger(__name__)

OP_COLUMN = "_kafscale_op"
UPSERT_PROPERTY = "kafscale.upsert-key"
_ORDER = "_kafscale_order"


class CdcError(ValueError):
    """A value that is not a Debezium change event."""


def unwrap_debezium(value: Any) -> tuple[str, dict[str, Any] | None]:
    """(``u`` | ``d``, row) of a Debezium envelope (JSON ``{"payload": ...}`` accepted)."""
    if isinstance(value, dict) and "payload" in value and "op" not in value:
        value = value["payload"]
    if not isinstance(value, dict) or "op" not in value:
        raise CdcError("not a Debezium change event (no op field)")
    op = value["op"]
    if op in ("c", "u", "r"):
        after = value.get("after")
        if not isinstance(after, dict):
            raise CdcError(f"Debezium op {op!r} without an after row")
        return "u", after
    if op == "d":
        before = value.get("before")
        if not isinstance(before, dict):
            raise CdcError("Debezium delete without a before row (REPLICA IDENTITY?)")
        return "d", before
    raise CdcError(f"unsupported Debezium op {op!r}")


def unwrap_json_values(values: Sequence[bytes | None]) -> tuple[list[bytes | None], list[str]]:
    """Schemaless JSON Debezium events -> (row JSON, op) per value; bad ones keep their
    bytes and op ``!reason`` (so they end as dead letters with the reason)."""
    rows: list[bytes | None] = []
    ops: list[str] = []
    for raw in values:
        if raw is None:
            rows.append(None)
            ops.append("skip")  # Debezium's tombstone after a delete
            continue
        try:
            op, row = unwrap_debezium(json.loads(raw))
        except (ValueError, CdcError) as exc:
            rows.append(raw)
            ops.append(f"!{exc}")
            continue
        rows.append(json.dumps(row).encode())
        ops.append(op)
    return rows, ops


def delete_filter(keys: pa.Table) -> BooleanExpression | None:
    """A predicate matching the rows with any of ``keys`` (None: no non-null key)."""
    names = keys.column_names
    keys = keys.filter(functools.reduce(pc.and_, [pc.is_valid(keys[n]) for n in names]))
    if keys.num_rows == 0:
        return None
    if len(names) == 1:
        vals = list(dict.fromkeys(keys.column(0).to_pylist()))
        if len(vals) > 1:
            return In(names[0], vals)  # type: ignore[call-arg,arg-type]
        return _eq(names[0], vals[0])
    terms: list[BooleanExpression] = []
    for row in dict.fromkeys(zip(*(keys.column(n).to_pylist() for n in names), strict=True)):
        eqs = [_eq(n, v) for n, v in zip(names, row, strict=True)]
        terms.append(functools.reduce(_and, eqs))
    return functools.reduce(_or, terms)


def _eq(name: str, value: Any) -> BooleanExpression:
    return EqualTo(name, value)  # type: ignore[call-arg,arg-type]


def _and(a: BooleanExpression, b: BooleanExpression) -> BooleanExpression:
    return And(a, b)


def _or(a: BooleanExpression, b: BooleanExpression) -> BooleanExpression:
    return Or(a, b)


def fold_files(
    io: FileIO,
    files: Sequence[WrittenFile],
    key_cols: Sequence[str],
    location: str,
    run_id: str,
    partition_by: str = "none",
) -> tuple[list[WrittenFile], pa.Table]:
    """(the folded files, one per partition value (none if every key was deleted), the
    keys they touch)."""
    tables = []
    for f in files:
        with io.new_input(f.path).open() as stream:
            tables.append(pq.read_table(stream))
    data = pa.concat_tables(tables, promote_options="permissive")
    missing = [k for k in key_cols if k not in data.column_names]
    if missing:
        raise IngestError(f"upsert key column(s) {missing} are not in the records")
    n = data.num_rows
    order = pc.sort_indices(
        pa.table({"t": data["timestamp"], "p": data["partition"], "o": data["offset"]}),
        sort_keys=[("t", "ascending"), ("p", "ascending"), ("o", "ascending")],
    )
    data = data.take(order).append_column(_ORDER, pa.array(range(n), pa.int64()))
    last = data.group_by(list(key_cols), use_threads=False).aggregate([(_ORDER, "max")])
    latest = data.take(last[f"{_ORDER}_max"]).sort_by(_ORDER)
    keys = latest.select(list(key_cols))
    keep = latest.filter(pc.not_equal(latest[OP_COLUMN], "d")).drop_columns([OP_COLUMN, _ORDER])
    for f in files:
        io.delete(f.path)
    if keep.num_rows == 0:
        return [], keys
    from ingest_job.task import _partition_groups, write_parquet

    fields: dict[str, set[str]] = {}
    for f in files:
        for name, kind in f.fields:
            fields.setdefault(name, set()).add(kind)
    merged = tuple(sorted((name, merge_kinds(k)[0]) for name, k in fields.items()))
    out = []
    tag = uuid.uuid4().hex[:8]
    for i, (pdir, part) in enumerate(_partition_groups(keep, partition_by)):
        path = f"{location}/data/{pdir}kafscale-{run_id}-upsert-{tag}-{i:03d}.parquet"
        size = write_parquet(io, path, part)
        out.append(WrittenFile(files[0].table, path, part.num_rows, size, merged))
    return out, keys


def stage_deletes(tx: Any, keys: pa.Table) -> None:
    """Inside the commit's transaction: delete the rows of ``keys`` (copy-on-write)."""
    snap = tx.table_metadata.current_snapshot()
    summary = snap.summary if snap is not None else None
    if summary is None or summary.get("total-records", "1") == "0":
        return  # nothing to delete from (a first run: no predicate over every key)
    if keys.num_columns == 1 and _rewrite_without(tx, keys):
        return
    pred = delete_filter(keys)
    if pred is None:
        return
    with warnings.catch_warnings():  # "did not match any records": new keys only
        warnings.filterwarnings("ignore", "Delete operation did not match any records")
        tx.delete(pred)


def with_ops(tbl: pa.Table, ops: Sequence[str]) -> pa.Table:
    """``tbl`` with the op column, rows marked ``skip`` (tombstones after deletes) dropped."""
    tbl = tbl.append_column(OP_COLUMN, pa.array(ops, pa.string()))
    return tbl.filter(pc.not_equal(tbl[OP_COLUMN], "skip"))


def key_ops(tbl: pa.Table, key_cols: Sequence[str]) -> list[str]:
    """Ops for plain upserts: a null value deletes its key when the key is the record key
    (Kafka's compaction semantics); otherwise a null value carries no key and is skipped."""
    nulls = pc.is_null(tbl["value"]).to_pylist()
    on_record_key = list(key_cols) == ["key"]
    return [("d" if on_record_key else "skip") if n else "u" for n in nulls]


def json_cdc_rows(src: pa.Table, json_tables: Any) -> tuple[pa.Table, pa.Table, Any]:
    """Schemaless JSON Debezium events: (rows with ops, dead letters, JsonColumns)."""
    rows, ops = unwrap_json_values(src["value"].to_pylist())
    bad = [i for i, op in enumerate(ops) if op.startswith("!")]
    ok = [i for i, op in enumerate(ops) if not op.startswith("!")]
    unwrapped = src.set_column(
        src.schema.get_field_index("value"), "value", pa.array(rows, pa.binary())
    ).take(pa.array(ok, pa.int64()))
    original = src.take(pa.array(ok, pa.int64()))["value"]
    good, dead, js = json_tables(unwrapped, original)
    good = with_ops(good, [ops[ok[i]] for i in js.rows])
    errs = src.take(pa.array(bad, pa.int64())).drop_columns(["headers"])
    errs = errs.append_column("error", pa.array([ops[i][1:] for i in bad], pa.string()))
    dead = pa.concat_tables([dead, errs]).sort_by("offset") if errs.num_rows else dead
    return good, dead, js


def _rewrite_without(tx: Any, keys: pa.Table) -> bool:
    """Copy-on-write of a single key column, vectorized: each data file whose key range
    may hold a touched key is read, filtered with ``pyarrow.compute.is_in`` and replaced
    (in the commit's transaction). False: not applicable, use pyiceberg's predicate."""
    from pyiceberg.expressions import AlwaysTrue, GreaterThanOrEqual, LessThanOrEqual
    from pyiceberg.io.pyarrow import ArrowScan, _dataframe_to_data_files

    name = keys.column_names[0]
    schema = tx.table_metadata.schema()
    try:
        schema.find_field(name)
    except ValueError:
        return False
    values = pc.unique(keys.column(0).drop_null())
    if len(values) == 0:
        return True
    row_filter: BooleanExpression = AlwaysTrue()
    if pa.types.is_integer(values.type) or pa.types.is_string(values.type):
        lo, hi = pc.min_max(values).values()
        row_filter = And(
            GreaterThanOrEqual(name, lo.as_py()),  # type: ignore[call-arg]
            LessThanOrEqual(name, hi.as_py()),  # type: ignore[call-arg]
        )
    commit_uuid = uuid.uuid4()
    counter = itertools.count(0)
    replaced = []
    for task in tx._scan(row_filter=row_filter).plan_files():
        df = ArrowScan(
            table_metadata=tx.table_metadata, io=tx._table.io, projected_schema=schema,
            row_filter=AlwaysTrue(),
        ).to_table(tasks=[task])  # fmt: skip
        try:
            hit = pc.is_in(df[name], value_set=values.cast(df[name].type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return False  # types that do not compare: pyiceberg's predicate decides
        if not pc.any(hit).as_py():
            continue
        kept = df.filter(pc.invert(pc.fill_null(hit, False)))
        new = list(
            _dataframe_to_data_files(
                table_metadata=tx.table_metadata, df=kept, io=tx._table.io,
                write_uuid=commit_uuid, counter=counter,
            )
        ) if kept.num_rows else []  # fmt: skip
        replaced.append((task.file, new))
    if replaced:
        with tx.update_snapshot().overwrite(commit_uuid=commit_uuid) as overwrite:
            for old, new in replaced:
                overwrite.delete_data_file(old)
                for data_file in new:
                    overwrite.append_data_file(data_file)
    return True
