"""The ingest job materialises committed records only: aborted transactions and markers
never reach a table, and an open transaction holds the job at the last stable offset."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow.parquet as pq

from broker.meta.schema import AbortedTxn, MarkerRequest, OpenTxn, aborted_txn_key, open_txn_key
from broker.txn_markers import control_batch
from ingest_job.manifest import plan_units, read_logs
from ingest_job.model import Destination, TaskSpec
from ingest_job.task import run_unit
from protocol.batch import set_base_offset
from protocol.records import build_batch
from segments.format import segment_key
from segments.writer import build_segment
from tests.unit.ingest_job.conftest import KafsEnv


def _txn(base: int, pid: int, values: list[bytes]) -> memoryview:
    raw = bytearray(
        build_batch(
            [(None, v, None) for v in values],
            producer_id=pid,
            producer_epoch=0,
            base_sequence=0,
            transactional=True,
        )
    )
    set_base_offset(raw, base)
    return memoryview(raw)


def _marker(base: int, pid: int, commit: bool) -> memoryview:
    raw = bytearray(control_batch(MarkerRequest(pid, 0, commit)))
    set_base_offset(raw, base)
    return memoryview(raw)


async def test_committed_only_and_held_at_the_lso(kafs_env: KafsEnv, tmp_path: Path) -> None:
    (w,) = await kafs_env.topic("t")
    plain = bytearray(build_batch([(None, b"plain-6", None), (None, b"plain-7", None)]))
    set_base_offset(plain, 6)
    batches = [
        _txn(0, 1, [b"c-0", b"c-1"]),
        _marker(2, 1, commit=True),
        _txn(3, 2, [b"a-3", b"a-4"]),
        _marker(5, 2, commit=False),
        memoryview(plain),
        _txn(8, 3, [b"open-8", b"open-9"]),
    ]
    seg = build_segment(0, batches)
    etag = await kafs_env.store.put_if_absent(segment_key("default", "t", 0, 0), seg.buffers)
    await w.commit_entry(0, seg.last_offset, seg.size, seg.record_count, etag)
    meta = kafs_env.meta
    await meta.put(aborted_txn_key("t", 0, 5), AbortedTxn(2, 3, 5).to_json())
    await meta.put(open_txn_key("t", 0, 3), OpenTxn(3, 0, 8, "x").to_json())

    logs = await read_logs(meta, ["t"])
    plan = plan_units(logs, {})
    assert plan.ends == {("t", 0): 8}  # held at the open transaction
    (unit,) = plan.units
    assert unit.aborted == ((2, 3, 5),)
    dests = (Destination("t", f"file://{tmp_path}/t", ((("t", 0), 0),)),)
    spec = TaskSpec("run1", kafs_env.store_url, "raw", "none", True, None, None, (), dests)
    res = await asyncio.to_thread(run_unit, spec, unit)
    rows = pq.read_table(res.files[0].path[len("file://") :]).to_pylist()
    assert [(r["offset"], r["value"]) for r in rows] == [
        (0, b"c-0"),
        (1, b"c-1"),
        (6, b"plain-6"),
        (7, b"plain-7"),
    ]
