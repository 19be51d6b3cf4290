"""Benchmark: KAFS segments -> Iceberg on Spark local[2], against pyarrow's Parquet limit.

    .venv/bin/python bench/ingest.py [--records 1000000 | --quick] [--value-bytes 200]
                                     [--compression none|gzip|snappy|lz4|zstd]
                                     [--value-format raw|json|avro] [--repeat N]

Writes ``--records`` records (JSON-ish values, keys, a header on every other record) as
4 MiB-ish segments into a local store with a real embedded manifest, then:

1. ingest: ``run_ingest`` (raw values, unpartitioned) on ``local[2]`` after a warm-up run
   (Spark and its Python workers already up), timed from plan to the last commit;
2. limit: the same records decoded into the same Arrow columns in memory, then only
   ``pyarrow.parquet.write_table`` timed (the job's writer options, one file per work
   unit's data).

Prints records/s and MB/s of segment bytes for both and the ratio ingest/limit.
``--repeat N`` times each side N times in the same run, alternating (the ingest each
time into a new table, then the limit into new files), and prints the best of each and
the median of the pairs' ratios: on a shared machine one sample of either side is mostly
noise. ``--quick``: 200,000 records.

``--value-format json|avro`` ingests the same values parsed into columns (``avro``: the
values are Avro in the Confluent wire format, their schema registered in the embedded
metadata store's registry); the limit then is pyarrow writing the committed table's
columns (read back from Iceberg) from memory, split like the job's files.

Also printed: the CPU seconds of the driver, the JVM and the Python workers during each
timed ingest (``/proc``) beside the limit's CPU, the load average through the pairs,
Spark's fixed cost per job (an empty job of as many tasks as the ingest's, after each
pair; it is part of the ingest's figures) and the one-off costs left out of them
(SparkSession start, the warm-up run that starts the Python workers). ``--records
4000000`` shows the same job where Spark's per-job cost is amortized over more data.

``--compare-python`` then runs the same ingest again (same data, another namespace) in a
new Spark context whose workers use the pure-Python record decoder and no native
columnar helpers (``KAFSCALE_PURE_PYTHON=1``: JSON values joined in Python, Avro decoded
value by value): the before/after of the native code in one run.
``--profile DIR`` writes cProfile stats of the driver and of every Spark task to DIR and
prints the hottest functions.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import glob
import os
import pstats
import shutil
import sys
import tempfile
import time
import uuid
from typing import TYPE_CHECKING

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from broker.meta.base import open_meta  # noqa: E402
from broker.meta.schema import (  # noqa: E402
    EndValue,
    SegmentMeta,
    TopicInfo,
    end_key,
    seg_entry_key,
    topic_key,
)
from ingest_job import columnar  # noqa: E402
from ingest_job.job import IngestConfig, run_ingest  # noqa: E402
from ingest_job.manifest import DEFAULT_UNIT_BYTES, load_logs, plan_units, task_groups  # noqa: E402
from ingest_job.task import PROFILE_ENV, parquet_options, read_unit  # noqa: E402
from protocol import fastrecords  # noqa: E402

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
from protocol.compression import Compression  # noqa: E402
from protocol.records import build_batch  # noqa: E402
from segments.format import segment_key
from segments.store import open_store  # noqa: E402
from segments.writer import build_segment

SEGMENT_BYTES = 4 * 1024 * 1024
BATCH_RECORDS = 500
PARTITIONS = 2


AVRO_SCHEMA = {
    "type": "record", "name": "Bench",
    "fields": [{"name": "id", "type": "long"}, {"name": "part", "type": "int"},
               {"name": "pad", "type": "string"}],
}  # fmt: skip


async def _avro_encoder(meta: object, topic: str) -> object:
    """A function encoding (id, part, pad) as Confluent-wire Avro of a registered schema."""
    import io
    import json

    import fastavro

    from broker.meta.schema import RegistrySchema
    from broker.registry.service import Registry

    sid, _v = await Registry(meta).register(  # type: ignore[arg-type]
        f"{topic}-value", RegistrySchema("AVRO", json.dumps(AVRO_SCHEMA))
    )
    parsed = fastavro.parse_schema(AVRO_SCHEMA)
    head = b"\0" + sid.to_bytes(4, "big")

    def encode(i: int, part: int, pad: str) -> bytes:
        out = io.BytesIO()
        out.write(head)
        fastavro.schemaless_writer(out, parsed, {"id": i, "part": part, "pad": pad})
        return out.getvalue()

    return encode


async def _generate(
    data: str, topic: str, records: int, value_bytes: int, codec: int, fmt: str = "raw"
) -> int:
    """Write ``records`` records over PARTITIONS partitions; returns segment bytes."""
    store = open_store(f"file://{data}/segments")
    meta = open_meta("embedded", data_dir=data)
    encode = await _avro_encoder(meta, topic) if fmt == "avro" else None
    info = TopicInfo(topic, uuid.uuid5(uuid.NAMESPACE_URL, topic), PARTITIONS, {})
    await meta.put(topic_key(topic), info.to_json())
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
                        encode(off + i, part, pad)  # type: ignore[operator]
                        if encode is not None
                        else f'{{"id": {off + i}, "part": {part}, "pad": "{pad}"}}'.encode(),
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
            entry = SegmentMeta(
                base, seg.last_offset, seg.size, seg.record_count, seg.max_timestamp, etag
            )
            await meta.put(seg_entry_key(topic, part, base), entry.to_json())
            total += seg.size
        await meta.put(end_key(topic, part), EndValue(n, 1).encode())
    await meta.close()
    await store.close()
    return total


def _limit(data: str, topic: str, out_dir: str, unit_bytes: int) -> tuple[float, int]:
    """Seconds pyarrow takes to write the decoded columns of every unit (from memory)."""
    logs = asyncio.run(load_logs("embedded", data, "/kafscale", [topic], "default"))
    plan = plan_units(logs, {}, None, unit_bytes)
    tables = [
        pa.Table.from_batches([read_unit(f"file://{data}/segments", u).to_arrow()])
        for u in plan.units
    ]
    rows = sum(t.num_rows for t in tables)
    LIMIT_CPU[0] = time.process_time()
    start = time.perf_counter()
    for i, t in enumerate(tables):
        pq.write_table(t, f"{out_dir}/limit-{i}.parquet", **parquet_options(t.schema))
    LIMIT_CPU[0] = time.process_time() - LIMIT_CPU[0]
    return time.perf_counter() - start, rows


#: the CPU seconds of the last limit's writes
LIMIT_CPU = [0.0]


def _limit_table(data: str, namespace: str, out_dir: str, units: int) -> tuple[float, int]:
    """Seconds pyarrow takes to write the committed table's columns, in ``units`` files."""
    from ingest_job.catalog import open_catalog

    tbl = open_catalog(None, data).load_table((namespace, "bench")).scan().to_arrow()
    step = -(-tbl.num_rows // max(units, 1))
    parts = [tbl.slice(i, step).combine_chunks() for i in range(0, tbl.num_rows, step)]
    LIMIT_CPU[0] = time.process_time()
    start = time.perf_counter()
    for i, t in enumerate(parts):
        pq.write_table(t, f"{out_dir}/limit-{i}.parquet", **parquet_options(t.schema))
    LIMIT_CPU[0] = time.process_time() - LIMIT_CPU[0]
    return time.perf_counter() - start, tbl.num_rows


def _ingest(
    spark: object, base: dict[str, object], namespace: str, warm_up: bool = True
) -> tuple[float, dict[str, float]]:
    """Warm-up run then the timed run of topic "bench" into ``namespace``: (seconds, CPU
    seconds of the driver, the JVM and the Python workers during the timed run)."""
    if warm_up:
        start = time.perf_counter()
        warm = IngestConfig(topics=("warmup",), namespace=namespace, **base)  # type: ignore[arg-type]
        run_ingest(warm, spark, say=lambda s: None)  # type: ignore[arg-type]
        ONE_OFF["warm-up run (Python workers start, imports)"] = time.perf_counter() - start
    before = tree_cpu()
    start = time.perf_counter()
    cfg = IngestConfig(topics=("bench",), namespace=namespace, **base)  # type: ignore[arg-type]
    summary = run_ingest(cfg, spark, say=print)  # type: ignore[arg-type]
    secs = time.perf_counter() - start
    after = tree_cpu()
    cpu = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    print(
        "phases: " + ", ".join(f"{k} {v:.2f}s" for k, v in summary.phases.items())
        + "; CPU " + ", ".join(f"{k} {v:.2f}s" for k, v in cpu.items())
        + f"; load {os.getloadavg()[0]:.1f}"
    )  # fmt: skip
    return (secs if summary.rows else float("nan")), cpu


#: one-off costs of the run (seconds), reported apart from the figures
ONE_OFF: dict[str, float] = {}


def tree_cpu() -> dict[str, float]:
    """CPU seconds (user + system) so far of this process ("driver"), the JVM it started
    and the JVM's Python workers (live processes only: the reused workers live on)."""
    tck = os.sysconf("SC_CLK_TCK")
    out = {"driver": 0.0, "JVM": 0.0, "Python workers": 0.0}
    tree, todo = [], [os.getpid()]
    while todo:
        tree.append(todo.pop())
        for kids in glob.glob(f"/proc/{tree[-1]}/task/*/children"):  # any thread's
            try:
                with open(kids) as f:
                    todo.extend(int(c) for c in f.read().split())
            except OSError:
                pass
    for pid in tree:
        try:
            with open(f"/proc/{pid}/stat") as f:
                name, _, rest = f.read().rpartition(")")
        except OSError:
            continue
        kind = "driver" if pid == os.getpid() else "JVM" if "java" in name else "Python workers"
        out[kind] += sum(int(v) for v in rest.split()[11:13]) / tck
    return out


def _empty_job(spark: object, tasks: int) -> float:
    """Seconds of a Spark job of ``tasks`` tasks doing nothing (Spark's fixed cost)."""
    sc = spark.sparkContext  # type: ignore[attr-defined]
    start = time.perf_counter()
    sc.parallelize(list(range(tasks)), tasks).map(lambda x: x).collect()
    return time.perf_counter() - start


def _print_profile(prof_dir: str, top: int = 25) -> None:
    for label, pattern in (("driver", "driver*.prof"), ("Spark tasks", "unit-*.prof")):
        files = sorted(glob.glob(os.path.join(prof_dir, pattern)))
        if not files:
            continue
        print(f"--- profile: {label} ({len(files)} files), by total time")
        pstats.Stats(*files).sort_stats("tottime").print_stats(top)


def _run_line(name: str, rows: int, mb: float, secs: float) -> str:
    return f"{name}: {secs:.2f}s  {rows / secs:,.0f} rec/s  {mb / secs:.1f} MB/s"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--quick", action="store_true", help="200,000 records (a shared machine)")
    ap.add_argument(
        "--repeat", type=int, default=1, help="time ingest and limit N times each; best of N"
    )
    ap.add_argument("--value-bytes", type=int, default=200)
    ap.add_argument("--compression", default="none", choices=[c.name.lower() for c in Compression])
    ap.add_argument("--unit-bytes", type=int, default=DEFAULT_UNIT_BYTES, help="as the job's")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--value-format", default="raw", choices=["raw", "json", "avro"])
    ap.add_argument("--compare-python", action="store_true", help="also time pure-Python decoding")
    ap.add_argument("--profile", metavar="DIR", help="write cProfile stats of driver and tasks")
    return ap


@dataclasses.dataclass
class Measured:
    """What one run of the bench measured (``_report`` prints it)."""

    seg_bytes: int = 0
    rows: int = 0
    units: int = 0
    tasks: int = 0
    pairs: list[tuple[float, float]] = dataclasses.field(default_factory=list)  # ingest, limit
    cpus: list[tuple[dict[str, float], float]] = dataclasses.field(default_factory=list)
    empty: list[float] = dataclasses.field(default_factory=list)  # empty jobs' seconds
    loads: list[float] = dataclasses.field(default_factory=list)
    python_s: float | None = None


def _measure(args: argparse.Namespace, work: str) -> Measured:
    """Generate the segments, then ingest and limit ``--repeat`` times, alternating."""
    codec = Compression[args.compression.upper()]
    fmt = args.value_format
    data = f"{work}/data"
    os.makedirs(data)
    m = Measured()
    m.seg_bytes = asyncio.run(_generate(data, "bench", args.records, args.value_bytes, codec, fmt))
    asyncio.run(_generate(data, "warmup", 20_000, args.value_bytes, codec, fmt))
    spark = _spark_session(args.profile)
    base = dict(
        store_url=f"file://{data}/segments",
        data_dir=data,
        partition_by="none",
        master="local[2]",
        progress_interval=5.0,
        unit_bytes=args.unit_bytes,
        value_format=fmt,
    )
    prof = cProfile.Profile() if args.profile else None
    if prof is not None:
        prof.enable()
    limit_dir = f"{work}/limit"
    os.makedirs(limit_dir)
    planned = plan_units(asyncio.run(load_logs("embedded", data, "/kafscale", ["bench"],
                                               "default")), {}, None,
                         args.unit_bytes).units  # fmt: skip
    m.units = len(planned)
    m.tasks = len(task_groups(planned, spark.sparkContext.defaultParallelism))

    def limit(i: int) -> tuple[float, int]:
        out = f"{limit_dir}/{i}"
        os.makedirs(out)
        if fmt == "raw":
            return _limit(data, "bench", out, args.unit_bytes)
        return _limit_table(data, "kafscale", out, m.units)

    # ingest and limit alternate, so that each pair shares the machine's load
    m.loads.append(os.getloadavg()[0])
    for i in range(args.repeat):
        ns = "kafscale" if i == 0 else f"kafscale_r{i}"  # the same work, a new table
        secs, cpu = _ingest(spark, base, ns, warm_up=i == 0)
        if i == 0 and prof is not None:
            prof.disable()
            prof.dump_stats(os.path.join(args.profile, "driver.prof"))
        lim, m.rows = limit(i)
        m.cpus.append((cpu, LIMIT_CPU[0]))
        m.pairs.append((secs, lim))
        m.empty.append(_empty_job(spark, m.tasks))
        m.loads.append(os.getloadavg()[0])
    spark.stop()
    if args.compare_python:
        m.python_s = _ingest_pure_python(base)
    return m


def _spark_session(profile: str | None) -> SparkSession:
    """The local[2] session the ingest runs in, its start timed (a one-off figure);
    ``profile``: the executors' cProfile output goes to that directory."""
    from ingest_job.spark import get_spark

    if profile:
        os.makedirs(profile, exist_ok=True)
        os.environ[PROFILE_ENV] = os.path.abspath(profile)
    start = time.perf_counter()
    spark = get_spark("local[2]")
    ONE_OFF["SparkSession start (JVM)"] = time.perf_counter() - start
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _ingest_pure_python(base: dict[str, object]) -> float:
    """Seconds of the same ingest with the executors' native decoders off."""
    from ingest_job.spark import get_spark

    os.environ.pop(PROFILE_ENV, None)
    spark = get_spark("local[2]", conf={"spark.executorEnv.KAFSCALE_PURE_PYTHON": "1"})
    spark.sparkContext.setLogLevel("ERROR")
    secs, _cpu = _ingest(spark, base, "kafscale_py")
    spark.stop()
    return secs


def _report(args: argparse.Namespace, m: Measured) -> None:
    ingest_s = min(p[0] for p in m.pairs)
    limit_s = min(p[1] for p in m.pairs)
    rows, mb = m.rows, m.seg_bytes / 1e6
    print(
        f"records: {rows}, segment bytes: {mb:.1f} MB, codec: {args.compression}, "
        f"value bytes: {args.value_bytes}, value format: {args.value_format}, "
        f"best of {args.repeat}"
    )
    impl = f"{fastrecords.IMPLEMENTATION} decoder, {columnar.IMPLEMENTATION} columnar"
    print(_run_line(f"ingest (Spark local[2] -> Iceberg, {impl})", rows, mb, ingest_s))
    print(_run_line("limit  (pyarrow Parquet from memory)", rows, mb, limit_s))
    print(f"ratio ingest/limit: {limit_s / ingest_s:.1%}")
    if len(m.pairs) > 1:
        ratios = sorted(lim / secs for secs, lim in m.pairs)
        print(
            "pairs (ingest s, limit s): "
            + ", ".join(f"({a:.2f}, {b:.2f})" for a, b in m.pairs)
            + f"; median pair ratio {ratios[len(ratios) // 2]:.1%}"
        )
    print(f"load average (1 min) through the pairs: {', '.join(f'{x:.1f}' for x in m.loads)}")
    job_cpu, lim_cpu = min(m.cpus, key=lambda c: sum(c[0].values()))
    print(
        f"CPU of the leanest ingest run: {sum(job_cpu.values()):.2f}s ("
        + ", ".join(f"{k} {v:.2f}s" for k, v in job_cpu.items())
        + f"); the limit's CPU that pair: {lim_cpu:.2f}s"
    )
    empty = sorted(m.empty)
    print(
        f"Spark's fixed cost per job (in the figures): an empty job of {m.tasks} tasks "
        f"({m.units} units) {empty[len(empty) // 2]:.2f}s (median of {len(empty)})"
    )
    print(
        "one-off costs (not in the figures): "
        + ", ".join(f"{k} {v:.2f}s" for k, v in ONE_OFF.items())
    )
    if m.python_s is not None:
        print(_run_line("ingest with the pure-Python decoder", rows, mb, m.python_s))
        print(f"ratio (pure-Python decoder) ingest/limit: {limit_s / m.python_s:.1%}")
    if args.profile:
        _print_profile(args.profile)


def main() -> int:
    args = _parser().parse_args()
    if args.quick:
        args.records = 200_000
    work = tempfile.mkdtemp(prefix="kafscale-bench-ingest-")
    try:
        measured = _measure(args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    _report(args, measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
