from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ingest_job.manifest import plan_units, read_logs
from ingest_job.model import CorruptInputError, Destination, TaskSpec, WorkUnit
from ingest_job.task import run_unit
from protocol.compression import Compression
from tests.unit.ingest_job.conftest import KafsEnv
from tests.unit.ingest_job.segdata import values_for


def _spec(env: KafsEnv, out: Path, fmt: str = "raw", part: str = "none", **starts: int) -> TaskSpec:
    dests = [
        Destination("t", f"file://{out}/t", ((("t", 0), starts.get("t", 0)),)),
        Destination("t_dead_letters", f"file://{out}/dl", ((("t", 0), starts.get("dl", 0)),)),
    ]
    return TaskSpec("run1", env.store_url, fmt, part, True, None, None, (), tuple(dests))


async def _units(env: KafsEnv) -> tuple[WorkUnit, ...]:
    logs = await read_logs(env.meta, ["t"])
    return plan_units(logs, {}).units


async def test_unit_writes_parquet_with_micros_timestamps(
    kafs_env: KafsEnv, tmp_path: Path
) -> None:
    (w,) = await kafs_env.topic("t")
    recs = await w.append(values_for("t", 0, 0, 30), compression=Compression.ZSTD)
    recs += await w.append(values_for("t", 0, 30, 20), compression=Compression.LZ4)
    (unit,) = await _units(kafs_env)
    res = await asyncio.to_thread(run_unit, _spec(kafs_env, tmp_path), unit)
    assert res.records == 50 and len(res.files) == 1
    f = res.files[0]
    assert f.table == "t" and f.records == 50 and f.path.startswith(f"file://{tmp_path}/t/data/")
    local = f.path[len("file://") :]
    assert Path(local).stat().st_size == f.size
    meta = pq.ParquetFile(local).schema.column(3)
    assert meta.name == "timestamp" and meta.physical_type == "INT64"
    assert meta.converted_type == "TIMESTAMP_MICROS"
    assert "isAdjustedToUTC=true" in str(meta.logical_type)
    rows = pq.read_table(local).to_pylist()
    assert [r["offset"] for r in rows] == [r.offset for r in recs]
    assert [r["value"] for r in rows] == [r.value for r in recs]


async def test_unit_reads_both_segment_layouts(kafs_env: KafsEnv, tmp_path: Path) -> None:
    """A partition whose older segments have their index beside them (version 1) and newer
    ones inside (version 2, docs/format.md): the unit decodes every record once."""
    (w,) = await kafs_env.topic("t")
    recs = await w.append(values_for("t", 0, 0, 30), version=1, batch_size=7)
    recs += await w.append(values_for("t", 0, 30, 25), batch_size=7)
    recs += await w.append(values_for("t", 0, 55, 5), version=1)
    (unit,) = await _units(kafs_env)
    res = await asyncio.to_thread(run_unit, _spec(kafs_env, tmp_path), unit)
    assert res.records == 60
    rows = [r for f in res.files for r in pq.read_table(f.path[len("file://") :]).to_pylist()]
    assert [r["offset"] for r in rows] == [r.offset for r in recs] == list(range(60))
    assert [r["value"] for r in rows] == [r.value for r in recs]


async def test_per_table_starts_and_json_dead_letters(kafs_env: KafsEnv, tmp_path: Path) -> None:
    (w,) = await kafs_env.topic("t")
    vals = values_for("t", 0, 0, 20)
    vals[3] = b"{broken"
    vals[15] = b"[1]"
    await w.append(vals)
    (unit,) = await _units(kafs_env)
    res = await asyncio.to_thread(run_unit, _spec(kafs_env, tmp_path, "json", t=10, dl=5), unit)
    by_table = {f.table: f for f in res.files}
    main = pq.read_table(by_table["t"].path[7:]).to_pylist()
    assert [r["offset"] for r in main] == [o for o in range(10, 20) if o != 15]
    assert main[0]["id"] == 10 and main[0]["amount"] == 15.0 and main[0]["ok"] is True
    assert dict(by_table["t"].fields) == {
        "amount": "double", "id": "long", "ok": "boolean", "topic_name": "string"
    }  # fmt: skip
    dead = pq.read_table(by_table["t_dead_letters"].path[7:]).to_pylist()
    assert [r["offset"] for r in dead] == [15]  # offset 3 is before the dead-letter start
    assert "not an object" in dead[0]["error"] and dead[0]["value"] == b"[1]"
    assert res.dead_letters == 1


async def test_day_partitioning_splits_files(kafs_env: KafsEnv, tmp_path: Path) -> None:
    (w,) = await kafs_env.topic("t")
    await w.append(values_for("t", 0, 0, 10), hour_step_ms=6 * 3_600_000)
    (unit,) = await _units(kafs_env)
    res = await asyncio.to_thread(run_unit, _spec(kafs_env, tmp_path, part="day"), unit)
    days = sorted(f.path.split("/data/")[1].split("/")[0] for f in res.files)
    assert days == [
        "timestamp_day=2025-11-22",
        "timestamp_day=2025-11-23",
        "timestamp_day=2025-11-24",
    ]
    assert sum(f.records for f in res.files) == 10


def _flip(pos: int) -> Callable[[bytearray], bytes]:
    def mangle(data: bytearray) -> bytes:
        data[pos] ^= 0x55
        return bytes(data)

    return mangle


async def test_corrupt_segment_names_the_object(kafs_env: KafsEnv, tmp_path: Path) -> None:
    (w,) = await kafs_env.topic("t")
    await w.append(values_for("t", 0, 0, 10), mangle=_flip(100))
    (unit,) = await _units(kafs_env)
    with pytest.raises(CorruptInputError, match=r"segment-0+\.kfs \(t/0 offsets 0\.\.9\).*CRC"):
        await asyncio.to_thread(run_unit, _spec(kafs_env, tmp_path), unit)
    assert not (tmp_path / "t").exists()  # nothing written


async def test_truncated_segment_is_reported(kafs_env: KafsEnv, tmp_path: Path) -> None:
    (w,) = await kafs_env.topic("t")
    await w.append(values_for("t", 0, 0, 10), mangle=lambda d: bytes(d[:-10]))
    (unit,) = await _units(kafs_env)
    with pytest.raises(CorruptInputError, match="footer"):
        await asyncio.to_thread(run_unit, _spec(kafs_env, tmp_path), unit)


async def test_missing_object_is_reported(kafs_env: KafsEnv, tmp_path: Path) -> None:
    (w,) = await kafs_env.topic("t")
    await w.append(values_for("t", 0, 0, 10))
    (unit,) = await _units(kafs_env)
    await kafs_env.store.delete(unit.segments[0].key)
    with pytest.raises(CorruptInputError, match="named by the manifest is missing"):
        await asyncio.to_thread(run_unit, _spec(kafs_env, tmp_path), unit)


async def test_segments_read_concurrently_keep_their_order(
    kafs_env: KafsEnv, tmp_path: Path
) -> None:
    from ingest_job.task import FETCH_CONCURRENCY, read_unit

    (w,) = await kafs_env.topic("t")
    for i in range(FETCH_CONCURRENCY * 2 + 1):  # more segments than reads at once
        await w.append(values_for("t", 0, i * 5, 5))
    (unit,) = await _units(kafs_env)
    assert len(unit.segments) == FETCH_CONCURRENCY * 2 + 1
    cols = await asyncio.to_thread(read_unit, kafs_env.store_url, unit)
    assert cols.to_table().column("offset").to_pylist() == list(range(45))
    await kafs_env.store.delete(unit.segments[6].key)  # a missing one among many
    with pytest.raises(CorruptInputError, match=f"{unit.segments[6].key}.*missing"):
        await asyncio.to_thread(read_unit, kafs_env.store_url, unit)


async def test_replaced_object_fails_the_etag_check(kafs_env: KafsEnv, tmp_path: Path) -> None:
    (w,) = await kafs_env.topic("t")
    await w.append(values_for("t", 0, 0, 10))
    (unit,) = await _units(kafs_env)
    key = unit.segments[0].key
    data = await kafs_env.store.get(key)
    await kafs_env.store.delete(key)  # a zombie's object at the same key, other bytes
    other = bytearray(data)
    other[40] ^= 1
    await kafs_env.store.put_if_absent(key, [bytes(other)])
    with pytest.raises(CorruptInputError, match="does not match its manifest ETag"):
        await asyncio.to_thread(run_unit, _spec(kafs_env, tmp_path), unit)


def test_table_names_for_topics_and_routes() -> None:
    from ingest_job.task import routed_table, table_name_for

    assert table_name_for("payments.eu-west") == "payments_eu_west"
    assert routed_table("events", "Page View") == "events_page_view"
    assert routed_table("events", None) == "events" and routed_table("events", "") == "events"
    assert routed_table("events", 7) == "events_7"
