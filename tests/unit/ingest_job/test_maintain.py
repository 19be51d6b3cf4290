from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from pyiceberg.catalog import Catalog

from ingest_job import catalog as cat
from ingest_job.maintain import (
    MaintainConfig,
    compact_table,
    expire_table,
    remove_orphans,
    run_maintain,
)
from tests.unit.ingest_job.conftest import KafsEnv
from tests.unit.ingest_job.segdata import values_for
from tests.unit.ingest_job.test_catalog import NS, _write


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    c = cat.open_catalog(None, str(tmp_path / "cat"))
    cat.ensure_namespace(c, NS)
    return c


async def _three_commits(env: KafsEnv, catalog: Catalog) -> None:
    (w,) = await env.topic("t")
    for i in range(3):
        await w.append(values_for("t", 0, w.next_offset, 10))
        files = await _write(env, catalog, i * 10, "json", run=f"r{i}")
        cat.commit_files(
            catalog, (NS, "t"), {("t", 0): i * 10} if i else {}, {("t", 0): i * 10 + 10}, files
        )


async def test_compaction_keeps_rows_and_offsets(kafs_env: KafsEnv, catalog: Catalog) -> None:
    await _three_commits(kafs_env, catalog)
    tbl = catalog.load_table((NS, "t"))
    before = sorted(tbl.scan().to_arrow().to_pylist(), key=lambda r: r["offset"])
    assert len(list(tbl.scan().plan_files())) == 3
    line = compact_table(tbl, 1 << 30)
    assert "compacted 3 files into 1" in line
    tbl = catalog.load_table((NS, "t"))
    assert len(list(tbl.scan().plan_files())) == 1
    assert sorted(tbl.scan().to_arrow().to_pylist(), key=lambda r: r["offset"]) == before
    assert cat.table_offsets(tbl) == {("t", 0): 30}
    assert "nothing to compact" in compact_table(tbl, 1 << 30)


async def test_expire_then_orphans_removes_replaced_and_stray_files(
    kafs_env: KafsEnv, catalog: Catalog
) -> None:
    await _three_commits(kafs_env, catalog)
    tbl = catalog.load_table((NS, "t"))
    stray = f"{tbl.location()}/data/kafscale-deadrun-u00000-a0-000.parquet"
    Path(stray[7:]).parent.mkdir(parents=True, exist_ok=True)
    Path(stray[7:]).write_bytes(b"left by a killed run")
    fresh = Path(stray[7:]).with_name("in-progress.parquet")
    fresh.write_bytes(b"a run still writing")
    old = time.time() - 3600
    os.utime(stray[7:], (old, old))
    lines = [compact_table(tbl, 1 << 30)]
    tbl = catalog.load_table((NS, "t"))
    lines.append(expire_table(tbl, 0))
    tbl = catalog.load_table((NS, "t"))
    lines.append(remove_orphans(tbl, 30))
    assert "removed 1 orphan files" in lines[-1]  # replaced files are too new; the stray is not
    assert not Path(stray[7:]).exists() and fresh.exists()
    lines.append(remove_orphans(tbl, 0))
    assert "removed 4 orphan files" in lines[-1]  # 3 compacted-away files + the fresh one
    tbl = catalog.load_table((NS, "t"))
    assert len(tbl.metadata.snapshots) == 1
    assert tbl.scan().to_arrow().num_rows == 30 and cat.table_offsets(tbl) == {("t", 0): 30}


async def test_run_maintain_touches_only_job_tables(
    kafs_env: KafsEnv, catalog: Catalog, tmp_path: Path
) -> None:
    await _three_commits(kafs_env, catalog)
    catalog.create_table((NS, "foreign"), schema=cat.base_schema())
    cfg = MaintainConfig(data_dir=str(tmp_path / "cat"), namespace=NS, compact=True)
    lines = list(run_maintain(cfg))
    assert any(line.startswith("t: compacted") for line in lines)
    assert not any("foreign" in line for line in lines)
