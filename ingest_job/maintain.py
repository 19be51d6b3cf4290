"""``kafscale ingest maintain``: compaction, snapshot expiry, orphan-file removal.

Only tables the ingest job created (property ``kafscale.kind``) are touched unless named.
Compaction rewrites the small files of each partition into one file in a single
``overwrite`` snapshot that carries the table's current ``kafscale.offsets`` forward, with
commit retries off: if an ingest run commits meanwhile, compaction gives up for that table.
Orphan removal deletes files under ``{location}/data/`` that no snapshot references and
that are older than the given age (so that files of a run still in progress survive).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io.pyarrow import parquet_files_to_data_files
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from ingest_job import catalog as cat
from ingest_job.files import list_files
from ingest_job.model import OFFSETS_PROPERTY, IngestError, offsets_to_json
from ingest_job.task import write_parquet

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MaintainConfig:
    data_dir: str = "./data"
    catalog: str | None = None
    namespace: str = "kafscale"
    tables: tuple[str, ...] = ()
    compact: bool = False
    expire_snapshots: bool = False
    remove_orphans: bool = False
    older_than_hours: float = 168.0
    orphan_age_minutes: float = 60.0
    target_file_bytes: int = 128 * 1024 * 1024


def _our_tables(catalog: Catalog, cfg: MaintainConfig) -> list[Table]:
    try:
        if cfg.tables:
            return [catalog.load_table((cfg.namespace, t)) for t in cfg.tables]
        out = []
        for ident in catalog.list_tables(cfg.namespace):
            tbl = catalog.load_table(ident)
            if cat.KIND_PROPERTY in tbl.properties:
                out.append(tbl)
        return out
    except Exception as exc:
        raise IngestError(f"catalog unreachable or namespace missing: {exc}") from exc


def _groups(tbl: Table, target: int) -> list[list[DataFile]]:
    """Per partition, the small files worth merging (two or more)."""
    by_part: dict[object, list[DataFile]] = {}
    for task in tbl.scan().plan_files():
        f = task.file
        if f.file_size_in_bytes < target:
            by_part.setdefault(repr(f.partition), []).append(f)
    return [files for files in by_part.values() if len(files) > 1]


def compact_table(tbl: Table, target: int) -> str:
    """Merge small files per partition; one snapshot, offsets carried forward."""
    groups = _groups(tbl, target)
    if not groups:
        return f"{tbl.name()[-1]}: nothing to compact"
    offsets = cat.table_offsets(tbl)
    stamp = f"compact-{int(time.time() * 1000)}"
    new_paths: list[str] = []
    old: list[DataFile] = []
    for i, files in enumerate(groups):
        parts = []
        for f in files:
            with tbl.io.new_input(f.file_path).open() as stream:
                parts.append(pq.read_table(stream))
        merged = pa.concat_tables(parts, promote_options="default").sort_by(
            [("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")]
        )
        first = files[0].file_path
        path = f"{first.rsplit('/', 1)[0]}/kafscale-{stamp}-{i:04d}.parquet"
        write_parquet(tbl.io, path, merged)
        new_paths.append(path)
        old.extend(files)
    props = {OFFSETS_PROPERTY: offsets_to_json(offsets)} if offsets else {}
    try:
        with tbl.transaction() as tx:
            with tx.update_snapshot(snapshot_properties=props).overwrite() as ow:
                for f in old:
                    ow.delete_data_file(f)
                for df in parquet_files_to_data_files(tbl.io, tx.table_metadata, iter(new_paths)):
                    ow.append_data_file(df)
    except CommitFailedException as exc:
        cat.delete_files(tbl.io, new_paths)
        return f"{tbl.name()[-1]}: compaction skipped, the table changed meanwhile ({exc})"
    return f"{tbl.name()[-1]}: compacted {len(old)} files into {len(new_paths)}"


def expire_table(tbl: Table, older_than_hours: float) -> str:
    before = len(tbl.metadata.snapshots)
    cutoff = datetime.now(UTC) - timedelta(hours=older_than_hours)
    tbl.maintenance.expire_snapshots().older_than(cutoff).commit()
    after = len(tbl.metadata.snapshots)
    return f"{tbl.name()[-1]}: expired {before - after} snapshots"


def _referenced(tbl: Table) -> set[str]:
    refs: set[str] = set()
    if tbl.current_snapshot() is None:
        return refs
    for path in tbl.inspect.all_files().column("file_path").to_pylist():
        refs.add(_norm(path))
    return refs


def _norm(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path.split("://", 1)[-1]


def remove_orphans(tbl: Table, age_minutes: float) -> str:
    refs = _referenced(tbl)
    cutoff = time.time() - age_minutes * 60
    removed: list[str] = []
    for path, mtime in list_files(tbl.io, f"{tbl.location()}/data"):
        if _norm(path) in refs or mtime > cutoff:
            continue
        tbl.io.delete(path)
        removed.append(path)
    for p in removed:
        log.info("removed orphan %s", p)
    return f"{tbl.name()[-1]}: removed {len(removed)} orphan files"


def run_maintain(cfg: MaintainConfig) -> Iterable[str]:
    """Run the requested maintenance on each table; yields one line per action."""
    catalog = cat.open_catalog(cfg.catalog, cfg.data_dir)
    for tbl in _our_tables(catalog, cfg):
        if cfg.compact:
            yield compact_table(tbl, cfg.target_file_bytes)
            tbl = catalog.load_table(tbl.name())
        if cfg.expire_snapshots:
            yield expire_table(tbl, cfg.older_than_hours)
            tbl = catalog.load_table(tbl.name())
        if cfg.remove_orphans:
            yield remove_orphans(tbl, cfg.orphan_age_minutes)
