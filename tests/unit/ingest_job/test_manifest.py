from __future__ import annotations

import pytest

from ingest_job.manifest import load_logs, plan_units, read_logs
from ingest_job.model import Gap, IngestError
from tests.unit.ingest_job.conftest import KafsEnv
from tests.unit.ingest_job.segdata import values_for


async def test_reads_only_committed_manifest_entries(kafs_env: KafsEnv) -> None:
    (w,) = await kafs_env.topic("orders")
    await w.append(values_for("orders", 0, 0, 10))
    await w.append(values_for("orders", 0, 10, 5))
    await w.append(values_for("orders", 0, 15, 5), commit=False)  # stray object: not data
    (log,) = await read_logs(kafs_env.meta, ["orders"])
    assert log.next_offset == 15
    assert [(s.base, s.last, s.records) for s in log.segments] == [(0, 9, 10), (10, 14, 5)]
    assert log.segments[0].key == "default/orders/0/segment-00000000000000000000.kfs"
    assert all(s.etag for s in log.segments)
    assert len(await kafs_env.store.list("default/orders/0/")) == 3


async def test_unknown_topic_is_an_error(kafs_env: KafsEnv) -> None:
    with pytest.raises(IngestError, match="'nope'"):
        await read_logs(kafs_env.meta, ["nope"])


async def test_read_only_open_while_writer_holds_the_store(kafs_env: KafsEnv) -> None:
    ws = await kafs_env.topic("t", 2)
    await ws[1].append(values_for("t", 1, 0, 3))
    logs = await load_logs("embedded", str(kafs_env.data_dir), "/kafscale", ["t"], "default")
    assert [(lg.partition, lg.next_offset) for lg in logs] == [(0, 0), (1, 3)]


async def test_plan_resumes_groups_and_reports_gaps(kafs_env: KafsEnv) -> None:
    (w,) = await kafs_env.topic("g")
    for _ in range(4):
        await w.append(values_for("g", 0, w.next_offset, 10))
    (log,) = await read_logs(kafs_env.meta, ["g"])
    size = log.segments[1].size + log.segments[2].size
    plan = plan_units([log], {("g", 0): 15}, unit_bytes=size)
    assert [(u.start, u.end, [s.base for s in u.segments]) for u in plan.units] == [
        (15, 30, [10, 20]),
        (30, 40, [30]),
    ]
    assert plan.ends == {("g", 0): 40} and plan.records == 25 and plan.gaps == ()
    # retention removed the first two segments' entries: reported as a gap
    await kafs_env.meta.delete("/logs/g/0/segments/00000000000000000000")
    await kafs_env.meta.delete("/logs/g/0/segments/00000000000000000010")
    (log,) = await read_logs(kafs_env.meta, ["g"])
    plan = plan_units([log], {("g", 0): 5})
    assert plan.gaps == (Gap("g", 0, 5, 20),)
    assert str(plan.gaps[0]) == "g/0 offsets 5..19"
    assert [(u.start, u.end) for u in plan.units] == [(20, 40)]


async def test_max_records_is_shared_between_partitions(kafs_env: KafsEnv) -> None:
    ws = await kafs_env.topic("m", 3)
    for w, n in zip(ws, [30, 2, 30], strict=True):
        await w.append(values_for("m", w.partition, 0, n))
    logs = await read_logs(kafs_env.meta, ["m"])
    plan = plan_units(logs, {}, max_records=20)
    assert plan.records == 20
    assert plan.ends == {("m", 0): 9, ("m", 1): 2, ("m", 2): 9}
    assert {(u.partition, u.start, u.end) for u in plan.units} == {(0, 0, 9), (1, 0, 2), (2, 0, 9)}


async def test_offsets_beyond_the_log_end_are_refused(kafs_env: KafsEnv) -> None:
    (w,) = await kafs_env.topic("r")
    await w.append(values_for("r", 0, 0, 3))
    logs = await read_logs(kafs_env.meta, ["r"])
    with pytest.raises(IngestError, match="beyond the log end"):
        plan_units(logs, {("r", 0): 10})
