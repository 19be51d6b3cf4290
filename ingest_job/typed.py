"""Typed tables from the schema registry (``--value-format avro|protobuf|json-schema``).

Driver side: :func:`load_registry` reads every registered schema from the metadata store
(read-only, like the manifest) and the versions of each topic's subject
``<topic>-value`` (TopicNameStrategy); :func:`evolve_table` brings a table's schema to
the union of those versions in order (new fields -> new optional columns, int -> long and
float -> double promoted) and stops the run with an IngestError on a change Iceberg
cannot apply (e.g. string -> int). Task side: :func:`write_typed` decodes each value with
the schema its id names and writes the columns; values that do not decode (not the wire
format, unknown id, bad payload, a value that does not fit its column) go to the
dead-letter table. docs/ingest.md, "Typed values".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyiceberg.exceptions import CommitFailedException, ValidationError
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import IcebergType, ListType, MapType, StructType

from broker.meta.schema import RegistrySchema
from ingest_job.model import IngestError
from ingest_job.typed_decode import (
    DECODERS,
    KINDS,
    WireFormatError,
    coerce_json,
    split_wire,
    top_level,
)
from ingest_job.typed_schema import TypedSchemaError, avro_columns, json_columns, proto_columns
from ingest_job.upsert import unwrap_debezium

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

log = logging.getLogger(__name__)
TYPED_FORMATS = tuple(KINDS)
MAX_EVOLVE_ATTEMPTS = 5


@dataclass(frozen=True, slots=True)
class RegistryEntry:
    schema_id: int
    schema: RegistrySchema
    refs: tuple[RegistrySchema, ...]  # resolved references, dependencies first
    ref_names: tuple[str, ...] = ()  # their reference names (Protobuf: import paths)


@dataclass(frozen=True, slots=True)
class RegistrySnapshot:
    """What the job read from the registry at planning time."""

    entries: dict[int, RegistryEntry]
    subjects: dict[str, list[tuple[int, int]]]  # subject -> [(version, schema id)]


@dataclass(frozen=True, slots=True)
class TypedSpec:
    """Broadcast to tasks: the schema kind, every schema, each table's value columns."""

    kind: str  # AVRO | PROTOBUF | JSON
    entries: tuple[RegistryEntry, ...]
    columns: tuple[tuple[str, pa.Schema], ...] = field(default=())
    cdc: str | None = None  # "debezium": values are change events, columns from "after"
    upsert: tuple[str, ...] = ()
    key: TypedSpec | None = None  # --key-format: the keys' spec (its columns: key_<field>)
    prefix: str = ""  # "key_" in a key spec

    def columns_of(self, table: str) -> pa.Schema | None:
        for name, schema in self.columns:
            if name == table:
                return schema
        return None


def subject_for(topic: str, part: str = "value") -> str:
    return f"{topic}-{part}"


async def _load(
    meta_url: str, data_dir: str, prefix: str, topics: Sequence[str]
) -> RegistrySnapshot:
    from broker.meta.base import open_meta
    from broker.registry.service import Registry, RegistryError

    meta = open_meta(meta_url, data_dir=data_dir, prefix=prefix, read_only=True)
    try:
        reg = Registry(meta)
        entries: dict[int, RegistryEntry] = {}
        for kv in await meta.range("/registry/schemas/"):
            sid = int(kv.key.rsplit("/", 1)[-1])
            schema = RegistrySchema.from_json(kv.value)
            try:
                named = await reg.resolve_named(schema.references)
            except ValueError as exc:
                log.warning("schema id %d: %s", sid, exc)
                continue
            refs = tuple(s for _n, s in named)
            entries[sid] = RegistryEntry(sid, schema, refs, tuple(n for n, _s in named))
        subjects: dict[str, list[tuple[int, int]]] = {}
        for subject in [subject_for(t, part) for t in topics for part in ("value", "key")]:
            try:
                versions = await reg.versions(subject, deleted=True)
            except RegistryError:
                versions = []
            subjects[subject] = [
                (v, (await reg.version(subject, str(v), deleted=True)).schema_id) for v in versions
            ]
        return RegistrySnapshot(entries, subjects)
    finally:
        await meta.close()


def load_registry(
    meta_url: str, data_dir: str, prefix: str, topics: Sequence[str]
) -> RegistrySnapshot:
    try:
        return asyncio.run(_load(meta_url, data_dir, prefix, topics))
    except IngestError:
        raise
    except Exception as exc:
        raise IngestError(f"cannot read the schema registry from {meta_url}: {exc}") from exc


def value_columns(entry: RegistryEntry, cdc: str | None = None, prefix: str = "") -> Schema:
    """The table columns one registered schema asks for (a change event's ``after``;
    ``prefix="key_"`` for keys)."""
    cols = _value_columns(entry, prefix)
    if not cdc:
        return cols
    after = next((f for f in cols.fields if f.name == "after"), None)
    if after is None or not isinstance(after.field_type, StructType):
        raise IngestError(f"schema id {entry.schema_id} is not a Debezium envelope (no after)")
    return Schema(*after.field_type.fields)


def _value_columns(entry: RegistryEntry, prefix: str) -> Schema:
    kind = entry.schema.schema_type
    try:
        if kind == "AVRO":
            return avro_columns(entry.schema.schema, [r.schema for r in entry.refs], prefix)
        if kind == "JSON":
            return json_columns(entry.schema.schema, prefix)
        from ingest_job.typed_decode import proto_pool

        _pool, file_desc = proto_pool(entry.schema, entry.refs, entry.ref_names)
        first = next(iter(file_desc.message_types_by_name.values()))
        return proto_columns(first, prefix)
    except (TypedSchemaError, WireFormatError, ValueError, KeyError, StopIteration) as exc:
        raise IngestError(f"schema id {entry.schema_id}: cannot map to Iceberg: {exc}") from exc


def _covered(have: IcebergType, want: IcebergType) -> bool:
    """Does ``have`` already hold ``want`` (same names and types, ids aside)?"""
    if isinstance(want, StructType):
        if not isinstance(have, StructType):
            return False
        names = {f.name: f for f in have.fields}
        return all(
            f.name in names and _covered(names[f.name].field_type, f.field_type)
            for f in want.fields
        )
    if isinstance(want, ListType):
        return isinstance(have, ListType) and _covered(have.element_type, want.element_type)
    if isinstance(want, MapType):
        return (
            isinstance(have, MapType)
            and _covered(have.key_type, want.key_type)
            and _covered(have.value_type, want.value_type)
        )
    return have == want


def evolve_table(
    catalog: Catalog,
    ident: tuple[str, str],
    versions: Sequence[tuple[str, int, RegistryEntry, Schema]],
) -> Table:
    """Union the table's schema with each subject version's columns, in order (one
    commit each)."""
    tbl = catalog.load_table(ident)
    for subject, version, entry, cols in versions:
        for attempt in range(MAX_EVOLVE_ATTEMPTS):
            if _covered(tbl.schema().as_struct(), cols.as_struct()):
                break
            try:
                with tbl.update_schema() as upd:
                    upd.union_by_name(cols)
                log.info("table %s: schema evolved to %s version %d", ident, subject, version)
            except CommitFailedException:
                log.info("schema update of %s conflicted (attempt %d)", ident, attempt + 1)
            except (ValidationError, ValueError) as exc:
                raise IngestError(
                    f"table {'.'.join(ident)}: {subject} version {version} (schema id "
                    f"{entry.schema_id}) is incompatible with the table's columns: {exc}; "
                    "nothing committed"
                ) from exc
            tbl = catalog.load_table(ident)
    return tbl


def arrow_columns(tbl: Table, base_names: Sequence[str]) -> pa.Schema:
    """The Arrow schema of the table's value columns (what task files must hold)."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    full = schema_to_pyarrow(tbl.schema(), include_field_ids=False)
    return pa.schema([f for f in full if f.name not in set(base_names)])


def prepare_typed(
    catalog: Catalog,
    namespace: str,
    value_format: str,
    snapshot: RegistrySnapshot,
    tables: Sequence[tuple[str, Sequence[str]]],
    base_names: Sequence[str],
    cdc: str | None = None,
    upsert: tuple[str, ...] = (),
    key_format: str | None = None,
) -> TypedSpec:
    """Evolve every data table (name, topics) to its subjects' versions; the task spec."""
    kind = KINDS[value_format]
    cols: list[tuple[str, pa.Schema]] = []
    key_cols: list[tuple[str, pa.Schema]] = []
    for name, topics in tables:
        versions = _versions(snapshot, topics, "value", value_format, cdc)
        keys = _versions(snapshot, topics, "key", key_format, None) if key_format else []
        tbl = evolve_table(catalog, (namespace, name), [*keys, *versions])
        key_names = {f.name for *_x, c in keys for f in c.fields}
        full = arrow_columns(tbl, base_names)
        cols.append((name, pa.schema([f for f in full if f.name not in key_names])))
        key_cols.append((name, pa.schema([f for f in full if f.name in key_names])))
    key = None
    if key_format:
        kkind = KINDS[key_format]
        kentries = tuple(e for e in snapshot.entries.values() if e.schema.schema_type == kkind)
        key = TypedSpec(kkind, kentries, tuple(key_cols), prefix="key_")
    entries = tuple(e for e in snapshot.entries.values() if e.schema.schema_type == kind)
    return TypedSpec(kind, entries, tuple(cols), cdc, upsert, key)


def _versions(
    snapshot: RegistrySnapshot, topics: Sequence[str], part: str, fmt: str, cdc: str | None
) -> list[tuple[str, int, RegistryEntry, Schema]]:
    """(subject, version, entry, columns) of the topics' ``-value`` / ``-key`` subjects."""
    kind = KINDS[fmt]
    out = []
    for topic in topics:
        subject = subject_for(topic, part)
        for version, sid in snapshot.subjects.get(subject, []):
            entry = snapshot.entries.get(sid)
            if entry is None:
                continue
            if entry.schema.schema_type != kind:
                raise IngestError(
                    f"{subject} version {version} is {entry.schema.schema_type}, not {fmt}"
                )
            prefix = "key_" if part == "key" else ""
            out.append((subject, version, entry, value_columns(entry, cdc, prefix)))
    return out


# ---------------------------------------------------------------------------- task side


class _Decoders:
    def __init__(self, spec: TypedSpec) -> None:
        self.entries = {e.schema_id: e for e in spec.entries}
        self.kind = spec.kind
        self.cache: dict[int, Callable[[bytes, int], Any]] = {}

    def decode(self, data: bytes) -> Any:
        sid, pos = split_wire(data)
        dec = self.cache.get(sid)
        if dec is None:
            entry = self.entries.get(sid)
            if entry is None:
                raise WireFormatError(
                    f"schema id {sid} is not a {self.kind} schema of the registry"
                )
            dec = self.cache[sid] = DECODERS[self.kind](entry.schema, entry.refs, entry.ref_names)
        return dec(data, pos)


def decode_values(
    spec: TypedSpec, columns: pa.Schema, values: Sequence[bytes | None], offsets: Sequence[int]
) -> tuple[list[int], pa.StructArray, list[tuple[int, str]], list[str]]:
    """(rows that decoded, their value columns as one struct array, dead (row, reason),
    upsert op per decoded row)."""
    decoders = _Decoders(spec)
    struct = pa.struct(list(columns))
    rows: list[dict[str, Any]] = []
    good: list[int] = []
    dead: list[tuple[int, str]] = []
    ops: list[str] = []
    tombstone = "skip" if spec.cdc or (spec.upsert and spec.upsert != ("key",)) else "d"
    for i, raw in enumerate(values):
        if raw is None:  # a tombstone: a row whose value columns are null
            rows.append({})
            good.append(i)
            ops.append(tombstone)
            continue
        try:
            value = decoders.decode(raw)
            op = "u"
            if spec.cdc:
                op, value = unwrap_debezium(value)
            row = top_level(value, spec.prefix)
            if spec.kind == "JSON":
                row = coerce_json(row, struct)
        except Exception as exc:  # any decoder failure is this record's dead letter
            dead.append((i, f"offset {offsets[i]}: {exc}"))
            continue
        rows.append(row)
        good.append(i)
        ops.append(op)
    try:
        arr = pa.array(rows, struct)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        arr, good, dead, ops = _row_by_row(rows, good, ops, dead, struct, offsets)
    return good, arr, dead, ops


def _row_by_row(
    rows: list[dict[str, Any]],
    good: list[int],
    ops: list[str],
    dead: list[tuple[int, str]],
    struct: pa.StructType,
    offsets: Sequence[int],
) -> tuple[pa.StructArray, list[int], list[tuple[int, str]], list[str]]:
    keep_rows, keep_idx, keep_ops = [], [], []
    for row, i, op in zip(rows, good, ops, strict=True):
        try:
            pa.array([row], struct)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            dead.append((i, f"offset {offsets[i]}: value does not fit the table's columns: {exc}"))
            continue
        keep_rows.append(row)
        keep_idx.append(i)
        keep_ops.append(op)
    dead.sort()
    return pa.array(keep_rows, struct), keep_idx, dead, keep_ops


def _fast_values(spec: TypedSpec, columns: pa.Schema, raw: pa.Table) -> pa.StructArray | None:
    """The columnar Avro path (ingest_job/typed_fast.py) where it cannot differ from
    :func:`decode_values` (no change events, no key columns), else None."""
    if spec.kind != "AVRO" or spec.cdc or spec.key is not None or spec.prefix:
        return None
    from ingest_job.typed_fast import avro_fast

    return avro_fast({e.schema_id: e for e in spec.entries}, columns, raw.column("value"))


def typed_tables(spec: TypedSpec, raw: pa.Table, table: str) -> tuple[pa.Table, pa.Table]:
    """(rows with their value columns, dead-letter rows) of one unit's records."""
    columns = spec.columns_of(table)
    if columns is None:
        raise IngestError(f"no value columns planned for table {table}")
    fast = _fast_values(spec, columns, raw)
    dead: list[tuple[int, str]] = []
    if fast is not None:
        good, arr, ops = list(range(raw.num_rows)), fast, ["u"] * raw.num_rows
    else:
        offsets = raw.column("offset").to_pylist()
        good, arr, dead, ops = decode_values(
            spec, columns, raw.column("value").to_pylist(), offsets
        )
    parts = [(columns, arr)]
    if spec.key is not None:
        kcols = spec.key.columns_of(table) or pa.schema([])
        kgood, karr, kdead, _ops = decode_values(
            spec.key, kcols, raw.column("key").to_pylist(), raw.column("offset").to_pylist()
        )
        both = sorted(set(good) & set(kgood))
        vpos, kpos = {r: i for i, r in enumerate(good)}, {r: i for i, r in enumerate(kgood)}
        ops = [ops[vpos[r]] for r in both]
        arr = arr.take(pa.array([vpos[r] for r in both], pa.int64()))
        parts = [(kcols, karr.take(pa.array([kpos[r] for r in both], pa.int64()))),
                 (columns, arr)]  # fmt: skip
        reasons: dict[int, list[str]] = {}
        for i, why in [*kdead, *dead]:
            reasons.setdefault(i, []).append(why)
        dead = [(i, "; ".join(w)) for i, w in sorted(reasons.items())]
        good = both
    out = raw if len(good) == raw.num_rows else raw.take(pa.array(good, pa.int64()))
    for cols, values in parts:
        for i, f in enumerate(cols):
            out = out.append_column(f, values.field(i))
    if spec.cdc or spec.upsert:
        from ingest_job.upsert import with_ops

        out = with_ops(out, ops)
    idx = pa.array([i for i, _ in dead], pa.int64())
    dl = raw.take(idx).drop_columns(["headers"])
    dl = dl.append_column("error", pa.array([r for _, r in dead], pa.string()))
    return out, dl
