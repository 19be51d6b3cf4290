"""Flush cycles of many partitions, committed per partition or as one cycle key.

    python -m bench.cycle_keys [--partitions 100,1000] [--cycles 60] [--stores embedded,etcd]

Two in-process brokers per metadata store (the embedded store, and a real etcd process:
``tests/fixtures/etcd.py``) on local-directory stores, one with ``--cycle-keys-min-partitions
2`` (docs/architecture.md, "Cycle keys") and one without, both with shared objects (one
object per cycle). Each cycle appends one 1 KiB batch to every partition of a topic and
waits until all are acknowledged; the two brokers alternate cycle by cycle. Per broker
it prints the median and p99 of a cycle's time to acknowledgement, and the metadata
transactions per cycle: all of them, counted at the store
(commits, folds, the deletion of folded keys; lease refreshes and watches are not
transactions), and those on the acknowledgement path. docs/benchmarks.md, "Round 13".
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.fs_probe import bench_dir
from bench.stats import percentile
from broker.meta.base import Compare, MetaStore, Op, TxnResult, open_meta
from broker.partition import PartitionLog
from broker.server import Broker
from protocol.batch import read_header
from protocol.records import build_batch
from tests.fixtures.inprocess import local_config


class CountingMeta:
    """The real store; counts the transactions sent to it."""

    def __init__(self, inner: MetaStore) -> None:
        self.inner = inner
        self.max_txn_ops = inner.max_txn_ops
        self.txns = 0

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        self.txns += 1
        return await self.inner.txn(compares, success, failure)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Side:
    def __init__(self, name: str, broker: Broker, meta: CountingMeta) -> None:
        self.name, self.broker, self.meta = name, broker, meta
        self.lgs: list[PartitionLog] = []
        self.acked: list[float] = []

    async def cycle(self, payload: bytes) -> None:
        b = self.broker
        started = time.perf_counter()
        waits = []
        for lg in self.lgs:
            view = memoryview(bytearray(payload))
            res = lg.append(read_header(view), view)
            assert res.done is not None, res.error
            b.logs.appended(lg, len(view))
            waits.append(res.done)
        await asyncio.gather(*waits)
        self.acked.append(time.perf_counter() - started)


async def open_side(name: str, tmp: Path, meta_url: str, prefix: str, cycles: bool) -> Side:
    cfg = local_config(
        tmp / name,
        meta_url=meta_url,
        meta_prefix=prefix,
        shared_objects_min_partitions=2,
        cycle_keys_min_partitions=2 if cycles else 0,
        merge_interval_ms=0,
    )
    cfg = replace(cfg, flush_interval_ms=1)
    meta = CountingMeta(open_meta(cfg.meta_url, cfg.data_dir, cfg.meta_prefix))
    b = Broker(cfg, meta=meta)
    await b.start()
    return Side(name, b, meta)


async def measure(
    sides: list[Side], partitions: int, cycles: int
) -> dict[str, tuple[float, float]]:
    """Run and print; per side its metadata transactions per cycle (all, ack path)."""
    payload = build_batch([(None, b"x" * 1024, None)])
    for s in sides:
        await s.broker.topics.create("bench", partitions)
        s.lgs = [await s.broker.logs.get("bench", p) for p in range(partitions)]
        await s.cycle(payload)  # warm: the first cycle after the takes
        s.acked.clear()
    totals = {s.name: (s.meta.txns, s.broker.logs.flusher.stats["txns"]) for s in sides}
    flushes = {s.name: s.broker.logs.flusher.stats["flush_cycles"] for s in sides}
    for i in range(cycles):
        for s in sides if i % 2 == 0 else sides[::-1]:  # alternate which goes first
            await s.cycle(payload)
    out = {}
    for s in sides:
        await s.broker.logs.folder.fold_all()  # what is pending is part of the cost
        n = s.broker.logs.flusher.stats["flush_cycles"] - flushes[s.name]
        all_txns = s.meta.txns - totals[s.name][0]
        ack_txns = s.broker.logs.flusher.stats["txns"] - totals[s.name][1]
        med = statistics.median(s.acked) * 1000
        p99 = percentile(sorted(s.acked), 0.99) * 1000
        print(
            f"  {s.name:<18} {partitions:5} partitions: acknowledged in median {med:7.2f} ms"
            f" p99 {p99:7.2f} ms | flush cycles {n} | metadata txns per cycle"
            f" {all_txns / n:5.2f} (acknowledgement path {ack_txns / n:5.2f})",
            flush=True,
        )
        out[s.name] = (all_txns / n, ack_txns / n)
    return out


async def run(stores: list[str], counts: list[int], cycles: int, tmp: Path) -> None:
    from tests.fixtures.etcd import start_etcd

    etcd = None
    try:
        for store in stores:
            url = "embedded"
            if store == "etcd":
                if etcd is None:
                    (tmp / "etcd").mkdir()
                    etcd = start_etcd(tmp / "etcd")
                url = etcd.url
            for count in counts:
                sides = [
                    await open_side(
                        f"{store}/{kind}",
                        tmp / f"{store}-{count}-{kind}",
                        url,
                        f"/{kind}{count}",
                        kind == "cycle-keys",
                    )  # fmt: skip
                    for kind in ("per-partition", "cycle-keys")
                ]
                try:
                    await measure(sides, count, cycles)
                finally:
                    for s in sides:
                        await s.broker.stop()
    finally:
        if etcd is not None:
            etcd.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cycle_keys", description=__doc__)
    p.add_argument("--partitions", default="100,1000", help="partitions per cycle (list)")
    p.add_argument("--cycles", type=int, default=60, help="measured cycles per broker")
    p.add_argument("--stores", default="embedded,etcd", help="embedded, etcd (list)")
    args = p.parse_args(argv)
    counts = [int(c) for c in args.partitions.split(",") if c.strip()]
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    with tempfile.TemporaryDirectory(prefix="kafscale-cycles-", dir=bench_dir()) as tmp:
        asyncio.run(run(stores, counts, args.cycles, Path(tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
