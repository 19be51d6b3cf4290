"""A flush cycle's commit phase alone: its chunks one after another, or sent together.

    python -m bench.commit_chunks [--partitions 150,1000] [--cycles 200]

For each metadata store (the embedded store in a temporary directory, and a real etcd
process: ``tests/fixtures/etcd.py``) and each partition count, runs ``--cycles`` commit
phases shaped like a flush cycle's (``broker.flush``): per partition a compare on its
owner key and on its end key's revision, a put of a manifest entry and of the new end;
chunked at the store's 128 operations (64 partitions). Per mode it prints the median and
p99 of the phase's wall time and the ratio of the medians, from the same run, the two
modes alternating cycle by cycle. docs/benchmarks.md, "Round 11".
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.fs_probe import bench_dir
from bench.stats import percentile
from broker.meta.base import Compare, MetaStore, Put
from broker.meta.embedded import EmbeddedStore
from broker.meta.schema import end_key, owner_key, seg_entry_key


class Partitions:
    """The owner values and end revisions a broker would guard its commits with."""

    def __init__(self, store: MetaStore, count: int) -> None:
        self.store = store
        self.count = count
        self.end_rev = [0] * count
        self.next = [0] * count

    async def take(self) -> None:
        for p in range(self.count):
            await self.store.put(owner_key("bench", p), b"owner")
            self.end_rev[p] = await self.store.put(end_key("bench", p), b"0")

    def chunk_txn(self, parts: range) -> tuple[list[Compare], list[Put]]:
        compares: list[Compare] = []
        ops: list[Put] = []
        for p in parts:
            compares.append(Compare(owner_key("bench", p), "value", "==", b"owner"))
            compares.append(Compare(end_key("bench", p), "mod_revision", "==", self.end_rev[p]))
            ops.append(Put(seg_entry_key("bench", p, self.next[p]), b'{"entry":1}'))
            ops.append(Put(end_key("bench", p), b"%d" % (self.next[p] + 1)))
        return compares, ops

    async def commit(self, parts: range) -> None:
        compares, ops = self.chunk_txn(parts)
        res = await self.store.txn(compares, ops)
        assert res.succeeded, "a guard failed: the bench's bookkeeping is wrong"
        for p in parts:
            self.end_rev[p] = res.revision
            self.next[p] += 1

    def chunks(self) -> list[range]:
        """The partitions of each chunk, as ``broker.flush`` cuts a cycle."""
        per = max(1, self.store.max_txn_ops // 2)
        return [range(i, min(i + per, self.count)) for i in range(0, self.count, per)]

    async def phase(self, together: bool) -> float:
        chunks = self.chunks()
        started = time.perf_counter()
        if together:
            await asyncio.gather(*(self.commit(c) for c in chunks))
        else:
            for c in chunks:
                await self.commit(c)
        return time.perf_counter() - started


async def measure(store: MetaStore, count: int, cycles: int) -> dict[str, list[float]]:
    parts = Partitions(store, count)
    await parts.take()
    out: dict[str, list[float]] = {"one by one": [], "together": []}
    for i in range(cycles):
        for together in (i % 2 == 0, i % 2 == 1):  # alternate which goes first
            out["together" if together else "one by one"].append(await parts.phase(together))
    return out


def report(store: MetaStore, name: str, count: int, times: dict[str, list[float]]) -> None:
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    p99 = {k: percentile(sorted(v), 0.99) * 1000 for k, v in times.items()}
    chunks = len(Partitions(store, count).chunks())
    print(
        f"{name:9} {count:5} partitions ({chunks} chunks): one by one median "
        f"{med['one by one']:6.2f} ms p99 {p99['one by one']:6.2f} | together median "
        f"{med['together']:6.2f} ms p99 {p99['together']:6.2f} | ratio "
        f"{med['together'] / med['one by one']:.2f}"
    )


async def run(counts: list[int], cycles: int, workdir: Path) -> None:
    from tests.fixtures.etcd import start_etcd

    for count in counts:
        store = EmbeddedStore(str(workdir / f"meta-{count}"), prefix="/bench")
        try:
            report(store, "embedded", count, await measure(store, count, cycles))
        finally:
            await store.close()
    (workdir / "etcd").mkdir()
    etcd = start_etcd(workdir / "etcd")
    try:
        from broker.meta.etcd import EtcdStore

        for count in counts:
            es = EtcdStore.from_url(etcd.url, prefix=f"/bench{count}")
            try:
                report(es, "etcd", count, await measure(es, count, cycles))
            finally:
                await es.close()
    finally:
        etcd.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.commit_chunks", description=__doc__)
    p.add_argument("--partitions", default="150,1000", help="partitions per cycle (list)")
    p.add_argument("--cycles", type=int, default=200, help="commit phases per mode")
    args = p.parse_args(argv)
    counts = [int(c) for c in args.partitions.split(",") if c.strip()]
    with tempfile.TemporaryDirectory(prefix="kafscale-commit-", dir=bench_dir()) as tmp:
        asyncio.run(run(counts, args.cycles, Path(tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
