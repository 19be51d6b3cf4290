"""The ingest job reads a compacted partition (docs/format.md, "Compacted segments"): the
gaps compaction leaves are not missing data (no gap reported, no failure), and every
remaining record lands at its original offset. The partition is written and compacted by
an in-process broker over a real local-directory store and a real embedded metadata
store, then read back by the job's own manifest reader and task."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from broker.meta.base import open_meta
from broker.server import Broker
from ingest_job.manifest import plan_units, read_logs
from ingest_job.model import Destination, TaskSpec
from ingest_job.task import run_unit
from protocol.batch import read_header
from protocol.errors import ErrorCode
from protocol.records import build_batch
from tests.fixtures.inprocess import local_config


async def test_ingest_reads_a_compacted_partition(tmp_path: Path) -> None:
    cfg = local_config(tmp_path, segment_delete_grace_ms=0)
    b = Broker(cfg)
    await b.start()
    try:
        await b.topics.create("t", 1, configs={"cleanup.policy": "compact"})
        lg = await b.logs.get("t", 0)
        for v in range(4):
            recs: list[Any] = [(b"k%d" % k, b"v%d-%d" % (v, k), []) for k in range(5)]
            view = memoryview(bytearray(build_batch(recs)))
            res = lg.append(read_header(view), view)
            assert res.error == ErrorCode.NONE and res.done is not None
            b.logs.appended(lg, len(view))
            await res.done
        assert b.logs.maintenance is not None
        comp = b.logs.maintenance.compactor
        ccfg = comp.topic_config(lg)
        assert ccfg is not None and await comp.compact(lg, ccfg)
    finally:
        await b.stop()
    meta = open_meta("embedded", data_dir=cfg.data_dir, read_only=True)
    try:
        plan = plan_units(await read_logs(meta, ["t"]), {})
    finally:
        await meta.close()
    assert plan.gaps == ()  # compaction's gaps are not data lost to retention
    (unit,) = plan.units
    dest = Destination("t", f"file://{tmp_path}/out", ((("t", 0), 0),))
    spec = TaskSpec("run1", cfg.store_url, "raw", "none", True, None, None, (), (dest,))
    done = await asyncio.to_thread(run_unit, spec, unit)
    rows = [r for f in done.files for r in pq.read_table(f.path[len("file://") :]).to_pylist()]
    assert [(r["offset"], r["value"]) for r in rows] == [(15 + k, b"v3-%d" % k) for k in range(5)]
