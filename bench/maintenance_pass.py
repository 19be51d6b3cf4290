"""The CPU one maintenance pass takes over many idle partitions (docs/benchmarks.md,
"Round 16").

    python -m bench.maintenance_pass [--partitions 1000] [--segments 5] [--passes 20]
                                     [--rounds 3] [--base-tree DIR]

An in-process broker on the local store and the embedded metadata store creates a topic
of ``--partitions`` partitions and commits ``--segments`` small segments to each, then
runs ``Maintenance.run_once`` ``--passes`` times with merges too young to run: what an
owner of many idle partitions spends every second (``--merge-interval-ms``). It prints
the median process CPU of a pass after the first (the first sweeps the new owner's
objects) and the merge looks counted by ``kafscale_maintenance_merge_plans_total``. With
``--base-tree`` the same is measured for another source tree too, the two alternating
round by round, each in a fresh interpreter; the ratio of the medians closes the report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.fs_probe import bench_dir

REPO = Path(__file__).resolve().parents[1]
HOUR_MS = 3_600_000


async def measure(tmp: Path, partitions: int, segments: int, passes: int) -> dict[str, Any]:
    """Pass CPU (ms, every pass after the first) and merge looks (after the first pass,
    when the tree counts them) of an in-process broker under ``tmp``."""
    from broker.config import BrokerConfig
    from broker.server import Broker
    from protocol.batch import read_header
    from protocol.records import build_batch

    config = replace(
        BrokerConfig(),
        listen_port=0,
        store_url=f"file://{tmp}/data",
        data_dir=str(tmp / "data"),
        flush_interval_ms=1,
        merge_interval_ms=HOUR_MS,  # the loop stays idle: the passes are run from here
        retention_check_interval_ms=HOUR_MS,
        merge_min_age_ms=HOUR_MS,  # nothing comes of age while this runs
        segment_delete_grace_ms=0,
    )
    b = Broker(config)
    await b.start()
    try:
        await b.topics.create("idle", partitions)
        logs = [await b.logs.get("idle", p) for p in range(partitions)]
        for _ in range(segments):  # one committed segment per partition per round
            waits = []
            for lg in logs:
                view = memoryview(bytearray(build_batch([(b"k", b"v" * 100, [])])))
                res = lg.append(read_header(view), view)
                assert res.done is not None, res.error
                b.logs.appended(lg, len(view))
                waits.append(res.done)
            await asyncio.gather(*waits)
        m = b.logs.maintenance
        assert m is not None
        await m.run_once()
        looks = m.stats.get("merge_plans", -1)
        cpu = []
        for _ in range(passes):
            t = time.process_time()
            await m.run_once()
            cpu.append((time.process_time() - t) * 1000)
        after = m.stats.get("merge_plans", -1)
        return {
            "segments": len(logs[0].segments),
            "pass_ms": cpu,
            "looks_per_pass": -1 if looks < 0 else (after - looks) / passes,
        }
    finally:
        await b.stop()


def _child(partitions: int, segments: int, passes: int) -> None:
    with tempfile.TemporaryDirectory(prefix="maintenance-pass-", dir=bench_dir()) as tmp:
        print(json.dumps(asyncio.run(measure(Path(tmp), partitions, segments, passes))))


def run_tree(tree: Path, partitions: int, segments: int, passes: int) -> dict[str, Any]:
    """``measure`` in a fresh interpreter that imports the broker from ``tree``."""
    from bench.alternating import in_tree  # here: the child loads this file from its tree

    return in_tree(tree, __file__, f"m._child({partitions}, {segments}, {passes})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.maintenance_pass", description=__doc__)
    p.add_argument("--partitions", type=int, default=1000)
    p.add_argument("--segments", type=int, default=5)
    p.add_argument("--passes", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--base-tree", type=Path, default=None)
    args = p.parse_args(argv)
    trees = [("this", REPO)] + ([("base", args.base_tree)] if args.base_tree else [])
    medians: dict[str, list[float]] = {name: [] for name, _ in trees}
    for r in range(args.rounds):
        order = trees if r % 2 == 0 else trees[::-1]
        for name, tree in order:
            res = run_tree(tree, args.partitions, args.segments, args.passes)
            med = statistics.median(res["pass_ms"])
            medians[name].append(med)
            looks = res["looks_per_pass"]
            print(
                f"round {r + 1} {name}: {res['segments']} segments/partition, pass CPU median "
                f"{med:.1f} ms, merge looks/pass " + ("not counted" if looks < 0 else f"{looks:g}"),
                flush=True,
            )
    summary = {name: statistics.median(v) for name, v in medians.items()}
    for name, med in summary.items():
        print(f"{name}: {args.partitions} partitions, pass CPU {med:.1f} ms (median of rounds)")
    if "base" in summary and summary["this"] > 0:
        print(f"base/this: {summary['base'] / summary['this']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
