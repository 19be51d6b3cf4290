"""Benchmark: KAFS segments -> Iceberg on Spark local[2], against pyarrow's Parquet limit.

    .venv/bin/python bench/ingest.py [--records 1000000] [--value-bytes 200]
                                     [--compression none|gzip|snappy|lz4|zstd]

Writes ``--records`` records (JSON-ish values, keys, a header on every other record) as
4 MiB-ish segments into a local store with a real embedded manifest, then:

1. ingest: ``run_ingest`` (raw values, unpartitioned) on ``local[2]`` after a warm-up run
   (Spark and its Python workers already up), timed from plan to the last commit;
2. limit: the same records decoded into the same Arrow columns in memory, then only
   ``pyarrow.parquet.write_table`` timed (same codec, one file per work unit's data).

Prints records/s and MB/s of segment bytes for both and the ratio ingest/limit.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from broker.meta.base import open_meta  # noqa: E402
from ingest_job.job import IngestConfig, run_ingest  # noqa: E402
from ingest_job.manifest import load_logs, plan_units  # noqa: E402
from ingest_job.task import PARQUET_COMPRESSION, read_unit  # noqa: E402
from protocol.compression import Compression  # noqa: E402
from protocol.records import build_batch  # noqa: E402
from segments.format import build_segment, segment_key  # noqa: E402
from segments.store import open_store  # noqa: E402

SEGMENT_BYTES = 4 * 1024 * 1024
BATCH_RECORDS = 500
PARTITIONS = 2


async def _generate(data: str, topic: str, records: int, value_bytes: int, codec: int) -> int:
    """Write ``records`` records over PARTITIONS partitions; returns segment bytes."""
    import json

    store = open_store(f"file://{data}/segments")
    meta = open_meta("embedded", data_dir=data)
    await meta.put(
        f"/topics/{topic}",
        json.dumps({"id": topic, "partitions": PARTITIONS, "configs": {}}).encode(),
    )
    pad = "x" * max(0, value_bytes - 60)
    total = 0
    ts0 = int(time.time() * 1000)
    for part in range(PARTITIONS):
        n = records // PARTITIONS
        off = 0
        while off < n:
            base = off
            batches, size = [], 0
            while off < n and size < SEGMENT_BYTES:
                cnt = min(BATCH_RECORDS, n - off)
                recs = [
                    (
                        f"key-{off + i}".encode(),
                        f'{{"id": {off + i}, "part": {part}, "pad": "{pad}"}}'.encode(),
                        [("trace", b"abcdef0123456789")] if (off + i) % 2 else [],
                    )
                    for i in range(cnt)
                ]
                b = build_batch(recs, base_offset=off, compression=codec, base_timestamp=ts0 + off)
                batches.append(memoryview(b))
                size += len(b)
                off += cnt
            seg = build_segment(base, batches)
            etag = await store.put_if_absent(segment_key("default", topic, part, base), seg.buffers)
            entry = {
                "base": base,
                "last": seg.last_offset,
                "bytes": seg.size,
                "records": seg.record_count,
                "max_ts": seg.max_timestamp,
                "etag": etag,
            }
            await meta.put(f"/logs/{topic}/{part}/segments/{base:020d}", json.dumps(entry).encode())
            total += seg.size
        await meta.put(
            f"/logs/{topic}/{part}/end", json.dumps({"next_offset": n, "epoch": 1}).encode()
        )
    await meta.close()
    await store.close()
    return total


def _limit(data: str, topic: str, out_dir: str) -> tuple[float, int]:
    """Seconds pyarrow takes to write the decoded columns of every unit (from memory)."""
    logs = asyncio.run(load_logs("embedded", data, "/kafscale", [topic], "default"))
    plan = plan_units(logs, {})
    tables = [
        pa.Table.from_batches([read_unit(f"file://{data}/segments", u).to_arrow()])
        for u in plan.units
    ]
    rows = sum(t.num_rows for t in tables)
    start = time.perf_counter()
    for i, t in enumerate(tables):
        pq.write_table(
            t,
            f"{out_dir}/limit-{i}.parquet",
            compression=PARQUET_COMPRESSION,
            coerce_timestamps="us",
        )
    return time.perf_counter() - start, rows


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--value-bytes", type=int, default=200)
    ap.add_argument("--compression", default="none", choices=[c.name.lower() for c in Compression])
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    codec = Compression[args.compression.upper()]
    work = tempfile.mkdtemp(prefix="kafscale-bench-ingest-")
    data = f"{work}/data"
    os.makedirs(data)
    try:
        seg_bytes = asyncio.run(_generate(data, "bench", args.records, args.value_bytes, codec))
        asyncio.run(_generate(data, "warmup", 20_000, args.value_bytes, codec))
        from ingest_job.spark import get_spark

        spark = get_spark("local[2]")
        spark.sparkContext.setLogLevel("ERROR")
        base = dict(
            store_url=f"file://{data}/segments",
            data_dir=data,
            partition_by="none",
            master="local[2]",
            progress_interval=5.0,
            unit_bytes=SEGMENT_BYTES * 2,
        )
        run_ingest(IngestConfig(topics=("warmup",), **base), spark, say=lambda s: None)  # type: ignore[arg-type]
        start = time.perf_counter()
        summary = run_ingest(IngestConfig(topics=("bench",), **base), spark, say=print)  # type: ignore[arg-type]
        ingest_s = time.perf_counter() - start
        assert summary.rows == args.records - args.records % PARTITIONS, summary.lines()
        limit_dir = f"{work}/limit"
        os.makedirs(limit_dir)
        limit_s, rows = _limit(data, "bench", limit_dir)
        spark.stop()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    mb = seg_bytes / 1e6
    print(
        f"records: {rows}, segment bytes: {mb:.1f} MB, codec: {args.compression}, "
        f"value bytes: {args.value_bytes}"
    )
    print(
        f"ingest (Spark local[2] -> Iceberg): {ingest_s:.2f}s  {rows / ingest_s:,.0f} rec/s  "
        f"{mb / ingest_s:.1f} MB/s"
    )
    print(
        f"limit  (pyarrow Parquet from memory): {limit_s:.2f}s  {rows / limit_s:,.0f} rec/s  "
        f"{mb / limit_s:.1f} MB/s"
    )
    print(f"ratio ingest/limit: {limit_s / ingest_s:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
