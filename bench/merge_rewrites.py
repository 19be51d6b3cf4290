"""What merges cost under sustained load on many partitions (docs/benchmarks.md,
"Round 17"): the bytes the broker writes and the CPU it spends per MB produced.

    python -m bench.merge_rewrites [--partitions 200] [--rate 4000] [--seconds 60]
                                   [--rounds 2] [--base-tree DIR] [--layout default]
                                   [--store local]

Per trial a fresh broker (local store, embedded metadata; ``--store s3``: a fresh
SeaweedFS and a bucket of its own; ``--layout cycles``: shared objects and cycle keys,
``bench.broker_targets.CYCLE_ARGS``) gets a topic of
``--partitions`` partitions, and one confluent-kafka producer (acks=all, idempotent)
writes ``--rate`` x 1 KiB messages a second round-robin over them for ``--seconds``:
each partition receives ``rate / partitions`` KiB/s, a segment per flush cycle, and the
merges rewrite them. After the produce the broker is left until it is idle (its merges
done, at most 30 s). Printed per trial: MB/s, the produce p99, the broker's CPU per MB
produced and the bytes it wrote to the disk per byte produced (``/proc/PID/io``
``write_bytes``: segments, merges, the metadata log; on S3 the S3 server's, whose CPU per
MB is printed too), both counted from the start of the produce to the end of the wait,
and, where the tree exports it, the bytes merges wrote
per byte produced (``kafscale_maintenance_merged_bytes_total``) and the merges per MB
produced (``kafscale_maintenance_merges_total``). With ``--base-tree``
another source tree's broker runs the same trials, the two alternating round by round
(the first tree of a round alternates too); the medians and their ratios close the
report. Processes are stopped by PID.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.broker_run import create_topics
from bench.broker_targets import (
    CYCLE_ARGS,
    S3_VOLUME_MB,
    BrokerLimits,
    Target,
    base_target,
    broker_target,
    cpu_seconds,
    quiesce,
)
from bench.broker_workers import run_worker
from bench.fs_probe import bench_dir
from bench.takeover import metric

MSG = 1024
MERGED = "kafscale_maintenance_merged_bytes_total"
MERGES = "kafscale_maintenance_merges_total"


def write_bytes(pid: int | None) -> int:
    """Bytes the process (all its threads) caused to be written to storage."""
    if pid is None:
        return 0
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    return 0


def counters(metrics_url: str | None) -> dict[str, float]:
    """The tree's merged-bytes and merges counters (those it has)."""
    if metrics_url is None:
        return {}
    return {n: v for n in (MERGED, MERGES) if (v := metric(metrics_url, n)) is not None}


def _per(before: dict[str, float], after: dict[str, float], name: str, n: float) -> float | None:
    if name not in before or name not in after:
        return None
    return (after[name] - before[name]) / n


@contextlib.contextmanager
def _broker(tree: Path | None, workdir: Path, extra: list[str], s3: bool) -> Iterator[Target]:
    """The broker of ``tree`` (None: this one) on the local store, or on a fresh
    SeaweedFS (``store_pid`` set) with a bucket of its own."""
    limits = BrokerLimits()
    with contextlib.ExitStack() as stack:
        url, store_pid = None, None
        if s3:
            from tests.fixtures.s3 import create_bucket, run_seaweedfs

            endpoint = stack.enter_context(run_seaweedfs(S3_VOLUME_MB))
            url, store_pid = endpoint.store_url(create_bucket(endpoint), "bench"), endpoint.pid
        if tree is None:
            t = stack.enter_context(broker_target("local", workdir, url, limits, extra))
        else:
            store = ["--store", url] if url else []
            t = stack.enter_context(base_target(workdir, tree, limits, [*extra, *store]))
        t.store_pid = store_pid
        yield t


def trial(tree: Path | None, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    extra = list(CYCLE_ARGS) if args.layout == "cycles" else []
    with _broker(tree, workdir, extra, args.store == "s3") as t:
        create_topics(t.bootstrap, ["m"], args.partitions)
        quiesce([t])
        writer = t.store_pid or t.pid  # who writes the objects to disk
        cpu, wrote, store_cpu = cpu_seconds(t.pid), write_bytes(writer), cpu_seconds(t.store_pid)
        merged0 = counters(t.metrics_url)
        spec = {"kind": "produce", "bootstrap": t.bootstrap, "topic": "m", "size": MSG,
                "partitions": args.partitions, "idempotence": True, "rate": args.rate,
                "messages": int(args.rate * args.seconds)}  # fmt: skip
        res = run_worker(spec)
        if res["errors"]:
            raise RuntimeError(f"produce failed: {res['first_error']}")
        waited = quiesce([t], timeout=30.0, window=1.0)
        mb = res["bytes"] / 1e6
        merged1 = counters(t.metrics_url)
        return {
            "mb_s": mb / res["seconds"],
            "p99_ms": res["p99_ms"],
            "cpu_ms_mb": (cpu_seconds(t.pid) - cpu) * 1000 / mb,
            "store_cpu_ms_mb": (cpu_seconds(t.store_pid) - store_cpu) * 1000 / mb,
            "written_per_byte": (write_bytes(writer) - wrote) / res["bytes"],
            "merged_per_byte": _per(merged0, merged1, MERGED, res["bytes"]),
            "merges_per_mb": _per(merged0, merged1, MERGES, mb),
            "settle_s": waited,
        }


def _fmt(r: dict[str, Any]) -> str:
    merged = "-" if r["merged_per_byte"] is None else f"{r['merged_per_byte']:.2f}"
    merges = "-" if r["merges_per_mb"] is None else f"{r['merges_per_mb']:.1f}"
    store = f"S3 server CPU {r['store_cpu_ms_mb']:6.2f} ms/MB  " if r["store_cpu_ms_mb"] else ""
    return (store + f"{r['mb_s']:6.2f} MB/s  p99 {r['p99_ms']:7.1f} ms  "
            f"CPU {r['cpu_ms_mb']:6.2f} ms/MB  "
            f"written/produced {r['written_per_byte']:5.2f}  merged/produced {merged}  "
            f"merges/MB {merges}  "
            f"(settled in {r['settle_s']:.1f} s)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.merge_rewrites", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--partitions", type=int, default=200)
    ap.add_argument("--rate", type=float, default=4000.0, help="messages (1 KiB) a second")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--layout", choices=("default", "cycles"), default="default")
    ap.add_argument("--store", choices=("local", "s3"), default="local")
    ap.add_argument("--base-tree", type=Path, help="another source tree, run alongside")
    args = ap.parse_args(argv)
    trees: list[tuple[str, Path | None]] = [("this tree", None)]
    if args.base_tree is not None:
        trees.append((f"base {args.base_tree}", args.base_tree))
    per_part = args.rate * MSG / args.partitions / 1024
    print(f"{args.partitions} partitions, {args.rate:.0f} msg/s x 1 KiB ({per_part:.1f} KiB/s "
          f"per partition) for {args.seconds:.0f} s, layout {args.layout}, store {args.store}",
          flush=True)  # fmt: skip
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in trees}
    with tempfile.TemporaryDirectory(prefix="kafscale-merge-rewrites-", dir=bench_dir()) as tmp:
        for rnd in range(args.rounds):
            order = trees if rnd % 2 == 0 else trees[::-1]
            for name, tree in order:
                started = time.monotonic()
                r = trial(tree, args, Path(tmp) / f"{rnd}-{len(results[name])}-{tree is None}")
                results[name].append(r)
                print(f"round {rnd + 1} {name:<12} {_fmt(r)} [{time.monotonic() - started:.0f} s]",
                      flush=True)  # fmt: skip
    medians: dict[str, dict[str, float]] = {}
    for name, rows in results.items():
        keys = ["mb_s", "p99_ms", "cpu_ms_mb", "store_cpu_ms_mb", "written_per_byte"]
        keys += [k for k in ("merged_per_byte", "merges_per_mb") if rows[0][k] is not None]
        medians[name] = {k: statistics.median(r[k] for r in rows) for k in keys}
        print(f"median {name:<12} " + "  ".join(f"{k} {v:.2f}" for k, v in medians[name].items()))
    if len(trees) == 2:
        a, b = medians[trees[0][0]], medians[trees[1][0]]
        print("this tree / base: " + "  ".join(f"{k} {a[k] / b[k]:.2f}" for k in a if b.get(k)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
