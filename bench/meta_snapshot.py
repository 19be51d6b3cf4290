"""What the embedded metadata store's writes wait for while it writes a snapshot
(docs/benchmarks.md, "Round 23").

    python -m bench.meta_snapshot [--entries 20000] [--value-bytes 100] [--snapshots 5]
                                  [--rounds 3] [--base-tree DIR]

An embedded store in a fresh work directory is filled with ``--entries`` keys, then one
writer puts one key after another (each answered after its ``fdatasync``, as a flush
cycle's commit is) while ``compact()`` writes ``--snapshots`` snapshots one after the
other. It prints the wall time of a snapshot and the latency of the puts answered while
one was being written (p50, p99, max) against those of the puts between snapshots. With
``--base-tree`` the same is measured for another source tree, the two alternating round
by round, each in a fresh interpreter.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.stats import percentile

REPO = Path(__file__).resolve().parents[1]
TXN_OPS = 128
WARM_PUTS = 200


async def measure(workdir: Path, entries: int, value_bytes: int, snapshots: int) -> dict[str, Any]:
    """Snapshot wall times and put latencies (ms) during and between snapshots."""
    from broker.meta.base import Put
    from broker.meta.embedded import EmbeddedStore

    store = EmbeddedStore(str(workdir), compact_bytes=1 << 40)  # only ``compact()`` snapshots
    value = b"v" * value_bytes
    try:
        for i in range(0, entries, TXN_OPS):
            ops = [Put(f"/fill/{j:08d}", value) for j in range(i, min(entries, i + TXN_OPS))]
            await store.txn([], ops)
        during: list[float] = []
        between: list[float] = []
        walls: list[float] = []
        snapshotting = False
        stop = asyncio.Event()

        async def writer() -> None:
            n = 0
            while not stop.is_set():
                was = snapshotting
                start = time.perf_counter()
                await store.put(f"/fill/{n % entries:08d}", value)
                ms = (time.perf_counter() - start) * 1000
                n += 1
                if n > WARM_PUTS:
                    (during if was or snapshotting else between).append(ms)

        task = asyncio.create_task(writer())
        while len(between) < WARM_PUTS:
            await asyncio.sleep(0.01)
        for _ in range(snapshots):
            snapshotting = True
            start = time.perf_counter()
            await store.compact()
            walls.append((time.perf_counter() - start) * 1000)
            snapshotting = False
            mark = len(between)
            while len(between) < mark + WARM_PUTS:  # puts between snapshots, measured too
                await asyncio.sleep(0.01)
        stop.set()
        await task
    finally:
        await store.close()
    return {"snapshot_ms": walls, "during_ms": during, "between_ms": between}


def _child(entries: int, value_bytes: int, snapshots: int) -> None:
    from bench.fs_probe import new_workdir

    workdir = new_workdir("meta-snapshot-")
    try:
        res = asyncio.run(measure(workdir, entries, value_bytes, snapshots))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(res))


def run_tree(tree: Path, entries: int, value_bytes: int, snapshots: int) -> dict[str, Any]:
    """``measure`` in a fresh interpreter that imports the store from ``tree``."""
    from bench.alternating import in_tree  # here: the child loads this file from its tree

    return in_tree(tree, __file__, f"m._child({entries}, {value_bytes}, {snapshots})")


def _line(name: str, res: dict[str, Any]) -> str:
    d, b = sorted(res["during_ms"]), sorted(res["between_ms"])
    return (
        f"{name}: snapshot {statistics.median(res['snapshot_ms']):.1f} ms (median); "
        f"puts while one is written: {len(d)}, p50 {percentile(d, 0.5):.2f} / p99 "
        f"{percentile(d, 0.99):.2f} / max {max(d, default=0):.2f} ms; between: p50 "
        f"{percentile(b, 0.5):.2f} / p99 {percentile(b, 0.99):.2f} / max {max(b, default=0):.2f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.meta_snapshot", description=__doc__)
    p.add_argument("--entries", type=int, default=20_000)
    p.add_argument("--value-bytes", type=int, default=100)
    p.add_argument("--snapshots", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--base-tree", type=Path, default=None)
    args = p.parse_args(argv)
    trees = [("this", REPO)] + ([("base", args.base_tree)] if args.base_tree else [])
    merged: dict[str, dict[str, list[float]]] = {
        name: {"snapshot_ms": [], "during_ms": [], "between_ms": []} for name, _ in trees
    }
    for r in range(args.rounds):
        for name, tree in trees if r % 2 == 0 else trees[::-1]:
            res = run_tree(tree, args.entries, args.value_bytes, args.snapshots)
            print(f"round {r + 1} " + _line(name, res), flush=True)
            for k, v in res.items():
                merged[name][k].extend(v)
    for name, res in merged.items():
        print(f"all rounds, {args.entries} entries, " + _line(name, res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
