"""Iceberg side of the job: catalogs, table creation/evolution, offsets, exactly-once commit.

Every table this job writes has ``commit.retry.num-retries=0`` (pyiceberg would otherwise
re-apply a stale append after a conflict) and each of our snapshots carries the offsets it
covers in the snapshot summary property ``kafscale.offsets``. A commit first reloads the
table and checks that its offsets are still the ones the run planned from; if another run
moved them, this run's files for that table are dropped instead of committed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.io import FileIO
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import DayTransform, HourTransform
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DoubleType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)
from pyiceberg.utils.config import Config

from ingest_job.jsonvals import ARROW_TYPES, merge_kinds
from ingest_job.model import (
    NEWEST_PROPERTY,
    OFFSETS_PROPERTY,
    IngestError,
    Offsets,
    WrittenFile,
    offsets_from_json,
    offsets_to_json,
)
from ingest_job.task import write_parquet

log = logging.getLogger(__name__)

RETRY_PROPERTY = "commit.retry.num-retries"
KIND_PROPERTY = "kafscale.kind"
ROUTE_PROPERTY = "kafscale.route"  # "{base table}:{field}" on tables made by routing
MAX_COMMIT_ATTEMPTS = 5

_TYPE_NAMES: dict[type, str] = {
    LongType: "long",
    DoubleType: "double",
    BooleanType: "boolean",
    StringType: "string",
}
_ICEBERG_TYPES: dict[str, IcebergType] = {
    "long": LongType(),
    "double": DoubleType(),
    "boolean": BooleanType(),
    "string": StringType(),
}


#: ``KAFSCALE_INGEST_KILL_AT=<point>`` kills the job (SIGKILL) at that point (fault tests)
KILL_AT_ENV = "KAFSCALE_INGEST_KILL_AT"


def fault_point(name: str) -> None:
    """Die here when ``$KAFSCALE_INGEST_KILL_AT`` names this point (never by default)."""
    if os.environ.get(KILL_AT_ENV) == name:
        import signal

        log.warning("fault point %s: killing the job (pid %d)", name, os.getpid())
        os.kill(os.getpid(), signal.SIGKILL)


class ConcurrentRunError(IngestError):
    """Another run committed the same offsets first; this run's files were dropped."""


def _base_fields(dead_letter: bool) -> list[NestedField]:
    fields = [
        NestedField(1, "topic", StringType()),
        NestedField(2, "partition", IntegerType()),
        NestedField(3, "offset", LongType()),
        NestedField(4, "timestamp", TimestamptzType()),
        NestedField(5, "timestamp_type", IntegerType()),
        NestedField(6, "key", BinaryType()),
        NestedField(7, "value", BinaryType()),
    ]
    if dead_letter:
        fields.append(NestedField(8, "error", StringType()))
    else:
        header = StructType(
            NestedField(10, "key", StringType()), NestedField(11, "value", BinaryType())
        )
        fields.append(NestedField(8, "headers", ListType(9, header, element_required=False)))
    return fields


def base_schema(dead_letter: bool = False) -> Schema:
    return Schema(
        *[NestedField(f.field_id, f.name, f.field_type) for f in _base_fields(dead_letter)]
    )


def partition_spec(partition_by: str) -> PartitionSpec:
    if partition_by == "none":
        return UNPARTITIONED_PARTITION_SPEC
    transform: DayTransform | HourTransform = (
        DayTransform() if partition_by == "day" else HourTransform()
    )
    return PartitionSpec(
        PartitionField(
            source_id=4, field_id=1000, transform=transform, name=f"timestamp_{partition_by}"
        )
    )


CREATE_ATTEMPTS = 3


def open_catalog(name: str | None, data_dir: str = "./data") -> Catalog:
    """The pyiceberg catalog ``name`` if configured, else the embedded SQLite catalog."""
    cname = name or "default"
    conf = Config().get_catalog_config(cname)
    try:
        if conf:
            return load_catalog(cname, **{k: str(v) for k, v in conf.items()})
        if name and name != "default":
            raise IngestError(
                f"catalog {name!r} is not configured (.pyiceberg.yaml or "
                f"PYICEBERG_CATALOG__{name.upper()}__URI / __TYPE / __WAREHOUSE)"
            )
        root = os.path.abspath(os.path.join(data_dir, "iceberg"))
        os.makedirs(os.path.join(root, "warehouse"), exist_ok=True)
        for attempt in range(CREATE_ATTEMPTS):
            try:
                return load_catalog(
                    "kafscale",
                    type="sql",
                    uri=f"sqlite:///{root}/catalog.db",
                    warehouse=f"file://{root}/warehouse",
                )
            except Exception as exc:
                # two runs opening a new catalog together both create its tables; the
                # one that loses finds them made ("table ... already exists"): opening
                # again then finds them, as a later run would
                if "already exists" not in str(exc) or attempt == CREATE_ATTEMPTS - 1:
                    raise
                log.info("catalog tables created by a concurrent run; opening again")
        raise AssertionError("unreachable")
    except IngestError:
        raise
    except Exception as exc:
        raise IngestError(f"cannot open catalog {cname!r}: {exc}") from exc


def ensure_namespace(catalog: Catalog, namespace: str) -> None:
    """Create ``namespace`` unless it exists. Two runs may race to create it: the SQL
    catalog checks, then inserts, so the loser fails on the insert with a constraint
    error instead of NamespaceAlreadyExistsError; a namespace that exists once the
    create failed was made by the winner, and is what this run needs."""
    try:
        catalog.create_namespace_if_not_exists(namespace)
    except NamespaceAlreadyExistsError:
        pass
    except Exception as exc:
        try:
            if catalog.namespace_exists(namespace):
                log.info("namespace %s was created by a concurrent run", namespace)
                return
        except Exception:  # noqa: BLE001, S110 - the first error is the one to report
            pass
        raise IngestError(f"catalog unreachable (namespace {namespace!r}): {exc}") from exc


def ensure_table(
    catalog: Catalog,
    namespace: str,
    name: str,
    partition_by: str,
    dead_letter: bool = False,
    location: str | None = None,
    properties: Mapping[str, str] | None = None,
) -> Table:
    """Load ``namespace.name``, creating it (with our properties) when missing."""
    ident = (namespace, name)
    try:
        tbl = catalog.load_table(ident)
    except NoSuchTableError:
        try:
            tbl = catalog.create_table(
                ident,
                schema=base_schema(dead_letter),
                partition_spec=partition_spec(partition_by),
                location=location,
                properties={
                    RETRY_PROPERTY: "0",
                    KIND_PROPERTY: "dead-letter" if dead_letter else "data",
                    **(properties or {}),
                },
            )
            log.info("created table %s.%s", namespace, name)
        except TableAlreadyExistsError:
            tbl = catalog.load_table(ident)
    except Exception as exc:
        raise IngestError(f"catalog unreachable (table {namespace}.{name}): {exc}") from exc
    if tbl.properties.get(RETRY_PROPERTY) != "0":
        with tbl.transaction() as tx:
            tx.set_properties({RETRY_PROPERTY: "0"})
        tbl = catalog.load_table(ident)
    return tbl


def routed_tables(catalog: Catalog, namespace: str, route: str) -> list[str]:
    """Names of the existing tables that routing ``route`` ("{base}:{field}") created."""
    try:
        names = [ident[-1] for ident in catalog.list_tables(namespace)]
        return sorted(
            n
            for n in names
            if catalog.load_table((namespace, n)).properties.get(ROUTE_PROPERTY) == route
        )
    except Exception as exc:
        raise IngestError(f"catalog unreachable (listing {namespace}): {exc}") from exc


def table_offsets(tbl: Table) -> Offsets:
    """Offsets of the newest snapshot (walking back through parents) that carries them."""
    snap = tbl.current_snapshot()
    while snap is not None:
        summary = snap.summary
        text = summary.get(OFFSETS_PROPERTY) if summary is not None else None
        if text:
            return offsets_from_json(text)
        snap = tbl.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id else None
    return {}


def table_newest_ms(tbl: Table) -> int:
    """Newest record timestamp (ms) of the newest snapshot carrying it (-1: none)."""
    snap = tbl.current_snapshot()
    while snap is not None:
        text = snap.summary.get(NEWEST_PROPERTY) if snap.summary is not None else None
        if text:
            return int(text)
        snap = tbl.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id else None
    return -1


def json_fields(tbl: Table) -> dict[str, str]:
    """The table's JSON value columns (beyond the Kafka ones) and their type names."""
    base = set(base_schema().column_names)
    out: dict[str, str] = {}
    for f in tbl.schema().fields:
        if f.name not in base and type(f.field_type) in _TYPE_NAMES:
            out[f.name] = _TYPE_NAMES[type(f.field_type)]
    return out


@dataclass(frozen=True, slots=True)
class CommitResult:
    table: str
    files: int
    records: int
    bytes: int
    offsets: Offsets
    snapshot_id: int | None


def _merged_types(table_types: Mapping[str, str], files: Sequence[WrittenFile]) -> dict[str, str]:
    """Column types after this commit: table types win, new fields merged across files."""
    seen: dict[str, set[str]] = {}
    for f in files:
        for name, kind in f.fields:
            if name not in table_types:
                seen.setdefault(name, set()).add(kind)
    merged = dict(table_types)
    for name, kinds in seen.items():
        merged[name], conflict = merge_kinds(kinds)
        if conflict:
            log.warning("field %r written as %s by different tasks: stored as string", name, kinds)
    return merged


def conform_files(io: FileIO, files: Sequence[WrittenFile], types: Mapping[str, str]) -> list[str]:
    """Paths to commit; files whose JSON column types differ from ``types`` are rewritten."""
    paths: list[str] = []
    for f in files:
        wrong = [n for n, k in f.fields if types.get(n, k) != k]
        if not wrong:
            paths.append(f.path)
            continue
        with io.new_input(f.path).open() as stream:
            data = pq.read_table(stream)
        for name in wrong:
            i = data.schema.get_field_index(name)
            col = data.column(name)
            target = ARROW_TYPES[types[name]]
            if target == pa.string() and col.type == pa.bool_():
                col = pa.array(
                    [None if v is None else ("true" if v else "false") for v in col.to_pylist()],
                    pa.string(),
                )
            # a long past 2**53 in a double column: the nearest double (as float())
            exact = not (pa.types.is_integer(col.type) and pa.types.is_floating(target))
            data = data.set_column(i, name, col.cast(target, safe=exact))
        new_path = f.path.replace(".parquet", "-conformed.parquet")
        write_parquet(io, new_path, data)
        io.delete(f.path)
        paths.append(new_path)
    return paths


def _evolve(
    tx_schema_update: object, table_types: Mapping[str, str], merged: Mapping[str, str]
) -> None:
    upd = tx_schema_update
    for name, kind in sorted(merged.items()):
        if name not in table_types:
            upd.add_column(name, _ICEBERG_TYPES[kind])  # type: ignore[attr-defined]


def commit_files(
    catalog: Catalog,
    ident: tuple[str, str],
    planned: Offsets,
    ends: Offsets,
    files: Sequence[WrittenFile],
    stage: Callable[[Any], None] | None = None,
    properties: Mapping[str, str] | None = None,
) -> CommitResult:
    """Commit ``files`` with the new offsets once, if the table still has ``planned``.

    ``stage(transaction)`` runs first inside the same transaction (upserts stage their
    deletes there: one atomic catalog commit for deletes, files and offsets).

    Raises ConcurrentRunError (after deleting ``files``) when another run moved the
    offsets of any partition in ``ends`` since planning.
    """
    tbl = catalog.load_table(ident)
    for attempt in range(MAX_COMMIT_ATTEMPTS):
        current = table_offsets(tbl)
        moved = [tp for tp in ends if current.get(tp, 0) != planned.get(tp, 0)]
        if moved:
            for f in files:
                tbl.io.delete(f.path)
            t, p = moved[0]
            raise ConcurrentRunError(
                f"table {'.'.join(ident)}: another run committed {t}/{p} "
                f"(offsets {planned.get((t, p), 0)} -> {current.get((t, p), 0)}); "
                "this run's files for it were dropped"
            )
        new_offsets = {**current, **ends}
        table_types = json_fields(tbl)
        merged = _merged_types(table_types, files)
        paths = conform_files(tbl.io, files, merged)
        files = [
            WrittenFile(f.table, p, f.records, f.size, ())
            for f, p in zip(files, paths, strict=True)
        ]
        try:
            with tbl.transaction() as tx:
                if set(merged) - set(table_types):
                    with tx.update_schema() as upd:
                        _evolve(upd, table_types, merged)
                if stage is not None:
                    stage(tx)
                tx.add_files(
                    paths,
                    snapshot_properties={
                        OFFSETS_PROPERTY: offsets_to_json(new_offsets),
                        **(properties or {}),
                    },
                )
                fault_point("commit.before_swap")
        except CommitFailedException as exc:
            log.info(
                "commit to %s conflicted (attempt %d): %s; re-checking", ident, attempt + 1, exc
            )
            tbl = catalog.load_table(ident)
            continue
        return _result(tbl, ident, files, ends)
    raise IngestError(f"table {'.'.join(ident)}: commit kept conflicting, nothing committed")


def _result(
    tbl: Table, ident: tuple[str, str], files: Sequence[WrittenFile], ends: Offsets
) -> CommitResult:
    snap = tbl.current_snapshot()
    return CommitResult(
        table=".".join(ident),
        files=len(files),
        records=sum(f.records for f in files),
        bytes=sum(f.size for f in files),
        offsets=ends,
        snapshot_id=snap.snapshot_id if snap else None,
    )


def delete_files(io: FileIO, paths: Iterable[str]) -> None:
    for p in paths:
        try:
            io.delete(p)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("could not delete %s: %s", p, exc)
