from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.transforms import DayTransform

from ingest_job import catalog as cat
from ingest_job.manifest import plan_units, read_logs
from ingest_job.model import OFFSETS_PROPERTY, Destination, IngestError, TaskSpec, WrittenFile
from ingest_job.task import run_unit, write_parquet
from tests.unit.ingest_job.conftest import KafsEnv
from tests.unit.ingest_job.segdata import values_for

NS = "kafscale"


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    c = cat.open_catalog(None, str(tmp_path / "cat"))
    cat.ensure_namespace(c, NS)
    return c


async def _write(
    env: KafsEnv, catalog: Catalog, start: int, fmt: str = "raw", run: str = "r"
) -> list[WrittenFile]:
    """Run the task for every unit of topic t from ``start``; returns the written files."""
    tbl = cat.ensure_table(catalog, NS, "t", "day")
    dests = [
        Destination("t", tbl.location(), ((("t", 0), start),), tuple(cat.json_fields(tbl).items()))
    ]
    if fmt == "json":
        dl = cat.ensure_table(catalog, NS, "t_dead_letters", "day", dead_letter=True)
        dests.append(Destination("t_dead_letters", dl.location(), ((("t", 0), start),)))
    spec = TaskSpec(run, env.store_url, fmt, "day", True, None, None,
                    tuple(catalog.properties.items()), tuple(dests))  # fmt: skip
    logs = await read_logs(env.meta, ["t"])
    files: list[WrittenFile] = []
    for unit in plan_units(logs, {("t", 0): start}).units:
        res = await asyncio.to_thread(run_unit, spec, unit)
        files += [f for f in res.files if f.table == "t"]
    return files


def test_tables_are_created_with_retries_off_and_partitioned(catalog: Catalog) -> None:
    tbl = cat.ensure_table(catalog, NS, "orders", "day")
    assert tbl.properties[cat.RETRY_PROPERTY] == "0"
    assert tbl.properties[cat.KIND_PROPERTY] == "data"
    (field,) = tbl.spec().fields
    assert isinstance(field.transform, DayTransform) and field.source_id == 4
    assert str(tbl.schema().find_type("timestamp")) == "timestamptz"
    dl = cat.ensure_table(catalog, NS, "orders_dead_letters", "none", dead_letter=True)
    assert "error" in dl.schema().column_names and dl.spec().is_unpartitioned()
    assert cat.table_offsets(tbl) == {}


async def test_commit_carries_offsets_and_rerun_sees_them(
    kafs_env: KafsEnv, catalog: Catalog
) -> None:
    (w,) = await kafs_env.topic("t")
    await w.append(values_for("t", 0, 0, 25))
    files = await _write(kafs_env, catalog, 0)
    res = cat.commit_files(catalog, (NS, "t"), {}, {("t", 0): 25}, files)
    assert res.records == 25 and res.files == len(files)
    tbl = catalog.load_table((NS, "t"))
    snap = tbl.current_snapshot()
    assert snap is not None and snap.summary is not None
    assert snap.summary[OFFSETS_PROPERTY] == '{"t":{"0":25}}'
    assert cat.table_offsets(tbl) == {("t", 0): 25}
    assert sorted(tbl.scan().to_arrow().column("offset").to_pylist()) == list(range(25))
    # an empty commit still moves the offsets (e.g. everything went elsewhere)
    cat.commit_files(catalog, (NS, "t"), {("t", 0): 25}, {("t", 0): 30}, [])
    assert cat.table_offsets(catalog.load_table((NS, "t"))) == {("t", 0): 30}


async def test_second_run_from_the_same_offsets_is_dropped(
    kafs_env: KafsEnv, catalog: Catalog
) -> None:
    (w,) = await kafs_env.topic("t")
    await w.append(values_for("t", 0, 0, 10))
    first = await _write(kafs_env, catalog, 0)
    second = await _write(kafs_env, catalog, 0, run="r2")
    assert {f.path for f in first}.isdisjoint(f.path for f in second)
    cat.commit_files(catalog, (NS, "t"), {}, {("t", 0): 10}, first)
    with pytest.raises(cat.ConcurrentRunError, match="another run committed t/0"):
        cat.commit_files(catalog, (NS, "t"), {}, {("t", 0): 10}, second)
    assert all(not Path(f.path[7:]).exists() for f in second)
    assert catalog.load_table((NS, "t")).scan().to_arrow().num_rows == 10


async def test_offsets_found_behind_foreign_snapshots(kafs_env: KafsEnv, catalog: Catalog) -> None:
    (w,) = await kafs_env.topic("t")
    await w.append(values_for("t", 0, 0, 5))
    cat.commit_files(catalog, (NS, "t"), {}, {("t", 0): 5}, await _write(kafs_env, catalog, 0))
    tbl = catalog.load_table((NS, "t"))
    extra = f"{tbl.location()}/data/timestamp_day=2025-11-22/foreign.parquet"
    write_parquet(tbl.io, extra, tbl.scan().to_arrow().slice(0, 1))
    tbl.add_files([extra])  # someone else's snapshot, without offsets
    tbl = catalog.load_table((NS, "t"))
    snap = tbl.current_snapshot()
    assert snap is not None and snap.summary is not None
    assert snap.summary.get(OFFSETS_PROPERTY) is None
    assert cat.table_offsets(tbl) == {("t", 0): 5}


async def test_json_columns_evolve_across_commits(kafs_env: KafsEnv, catalog: Catalog) -> None:
    (w,) = await kafs_env.topic("t")
    await w.append([b'{"a": 1}', b'{"a": 2}'])
    cat.commit_files(
        catalog, (NS, "t"), {}, {("t", 0): 2}, await _write(kafs_env, catalog, 0, "json")
    )
    await w.append([b'{"a": 3, "b": "new"}'])
    files = await _write(kafs_env, catalog, 2, "json", run="r2")
    cat.commit_files(catalog, (NS, "t"), {("t", 0): 2}, {("t", 0): 3}, files)
    tbl = catalog.load_table((NS, "t"))
    assert cat.json_fields(tbl) == {"a": "long", "b": "string"}
    rows = sorted(
        tbl.scan().to_arrow().select(["offset", "a", "b"]).to_pylist(), key=lambda r: r["offset"]
    )
    assert rows == [
        {"offset": 0, "a": 1, "b": None},
        {"offset": 1, "a": 2, "b": None},
        {"offset": 2, "a": 3, "b": "new"},
    ]


def test_files_with_conflicting_new_types_are_conformed(catalog: Catalog, tmp_path: Path) -> None:
    tbl = cat.ensure_table(catalog, NS, "c", "none")
    base = pa.table(
        {n: pa.array([], t) for n, t in zip(
            ["topic", "partition", "offset"], [pa.string(), pa.int32(), pa.int64()], strict=True
        )}
    )  # fmt: skip
    f1 = f"{tbl.location()}/data/a.parquet"
    f2 = f"{tbl.location()}/data/b.parquet"
    # a long past 2**53 becomes the nearest double, as float() makes it (a safe cast
    # refused it, and the commit failed)
    row = pa.table({"topic": ["t"], "partition": pa.array([0], pa.int32()), "offset": [0]})
    write_parquet(tbl.io, f1, row.append_column("x", pa.array([2**53 + 1], pa.int64())))
    write_parquet(tbl.io, f2, base.append_column("x", pa.array([], pa.float64())))
    files = [
        WrittenFile("c", f1, 0, 0, (("x", "long"),)),
        WrittenFile("c", f2, 0, 0, (("x", "double"),)),
    ]
    cat.commit_files(catalog, (NS, "c"), {}, {("t", 0): 1}, files)
    tbl = catalog.load_table((NS, "c"))
    assert cat.json_fields(tbl) == {"x": "double"}
    scanned = tbl.scan().to_arrow()
    assert scanned.schema.field("x").type == pa.float64()
    assert scanned.column("x").to_pylist() == [float(2**53 + 1)]


def test_unconfigured_named_catalog_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(IngestError, match="'nosuch' is not configured"):
        cat.open_catalog("nosuch", str(tmp_path))


def test_unreachable_catalog_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PYICEBERG_CATALOG__DOWN__TYPE", "sql")
    monkeypatch.setenv("PYICEBERG_CATALOG__DOWN__URI", f"sqlite:///{tmp_path}/no/such/dir/c.db")
    with pytest.raises(IngestError, match="'down'"):
        c = cat.open_catalog("down", str(tmp_path))
        cat.ensure_namespace(c, NS)


def test_ensure_namespace_lost_race_to_a_concurrent_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs create the namespace at once on one SQL catalog: the loser's existence
    check passes before the winner's insert lands, so its own insert breaks the unique
    constraint. ensure_namespace then finds the namespace there and goes on."""
    mine = cat.open_catalog(None, str(tmp_path / "cat"))
    theirs = cat.open_catalog(None, str(tmp_path / "cat"))
    real = mine.namespace_exists
    raced: list[bool] = []

    def check_then_lose(namespace: str | tuple[str, ...]) -> bool:
        if not raced:  # the other run inserts between this check and our insert
            raced.append(real(namespace))
            theirs.create_namespace(NS)
            return False
        return real(namespace)

    monkeypatch.setattr(mine, "namespace_exists", check_then_lose)
    cat.ensure_namespace(mine, NS)
    assert raced == [False] and real(NS)
    cat.ensure_table(mine, NS, "t", "day")  # the namespace is usable


def _open_together(data_dir: str, n: int) -> list[str]:
    """Open the embedded catalog of ``data_dir`` from ``n`` threads released together;
    the errors they met."""
    errors: list[str] = []
    barrier = threading.Barrier(n)

    def open_it() -> None:
        barrier.wait()
        try:
            cat.open_catalog(None, data_dir)
        except Exception as exc:  # collected: the caller's assertion names it
            errors.append(str(exc))

    threads = [threading.Thread(target=open_it) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_runs_opening_a_new_embedded_catalog_together_all_open_it(tmp_path: Path) -> None:
    """Each run creates the SQLite catalog's tables when it opens it; started together
    (two ingest processes, here six threads at a barrier), the losers found them
    already made and failed with "table iceberg_tables already exists"."""
    for round_ in range(5):
        assert _open_together(str(tmp_path / f"r{round_}"), 6) == []
