"""What idempotent producer state costs a broker, and what producer id expiration gives
back (``--producer-id-expiration-ms``, docs/architecture.md, "Idempotent producers").

``python -m bench.producer_ids [--producers N] [--expiration-ms MS] [--base-tree DIR]``:
per tree, a broker process on the local store and the embedded metadata store; a raw
Kafka client sends ``N`` Produce requests to one partition, each one batch of one
100-byte record from a different producer id (as ``N`` short-lived idempotent producers
would: a producer per task or per request leaves a new id each time). It then prints:

- the broker's resident memory (``VmRSS``) before and after, and per producer beyond
  what the same requests cost without producer ids (a first run of this tree: the log,
  its manifest, the cache);
- the ``kafscale_producer_ids`` gauge (this tree; a tree without it prints ``-``);
- with expiry (this tree only: ``--expiration-ms``, checked every second), the gauge and
  the RSS once every producer has expired, and how long that took after the last write;
  then the RSS after as many new producers again (the expired ones' memory reused).

The broker is stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import struct
import time
from pathlib import Path
from typing import Any

from bench.broker_run import create_topics
from bench.takeover import local_broker, metric

WINDOW = 256  # Produce requests in flight


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _gauge(metrics_url: str) -> float | None:
    return metric(metrics_url, "kafscale_producer_ids")


async def _produce(
    port: int, topic: str, producers: int, first_id: int = 10_000, plain: bool = False
) -> None:
    from kafka.protocol.producer import ProduceResponse

    from protocol.records import build_batch
    from tests.integration import kafka_raw as kr

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    value = b"x" * 100

    async def answers(n: int) -> None:
        for _ in range(n):
            (size,) = struct.unpack(">i", await reader.readexactly(4))
            data = await reader.readexactly(size)
            resp: Any = ProduceResponse.decode(data, version=8, header=True)
            err = resp.responses[0].partition_responses[0].error_code
            if err:
                raise RuntimeError(f"produce failed with error code {err}")

    sent = 0
    try:
        while sent < producers:
            n = min(WINDOW, producers - sent)
            for i in range(sent, sent + n):
                if plain:  # the same requests without a producer: what they cost besides
                    batch = build_batch([(None, value, None)])
                else:
                    batch = build_batch(
                        [(None, value, None)],
                        producer_id=first_id + i,
                        producer_epoch=0,
                        base_sequence=0,
                    )
                writer.write(kr.request_bytes(kr.produce_request(topic, 0, batch), 8, i + 1))
            await writer.drain()
            await answers(n)
            sent += n
    finally:
        writer.close()
        await writer.wait_closed()


def run_tree(
    tree: Path | None, producers: int, expiration_ms: int, plain: bool = False
) -> dict[str, float | None]:
    extra: list[str] = []
    if tree is None and expiration_ms > 0 and not plain:
        extra = ["--producer-id-expiration-ms", str(expiration_ms),
                 "--producer-id-expiration-check-interval-ms", "1000"]  # fmt: skip
    broker, metrics, workdir = local_broker(tree, "producer-ids-", extra)
    port = broker.port
    topic = "producer-ids"
    out: dict[str, float | None] = {}
    try:
        create_topics(broker.bootstrap, [topic], 1)
        asyncio.run(_produce(port, topic, 1))  # the partition taken, its first segment
        out["rss_before"] = _rss_mib(broker.pid)
        asyncio.run(_produce(port, topic, producers, plain=plain))
        written = time.monotonic()
        out["rss_after"] = _rss_mib(broker.pid)
        out["gauge_after"] = _gauge(metrics)
        if tree is None and expiration_ms > 0 and not plain:
            deadline = written + expiration_ms / 1000 + 120
            while (_gauge(metrics) or 0) > 0:  # a bench phase: until the loop expires them
                if time.monotonic() > deadline:
                    raise RuntimeError("producers never expired")
                time.sleep(0.2)
            out["expired_after_s"] = time.monotonic() - written
            out["rss_expired"] = _rss_mib(broker.pid)
            out["gauge_expired"] = _gauge(metrics)
            # as many new producers again: the memory of the expired ones is reused
            asyncio.run(_produce(port, topic, producers, first_id=10_000 + producers))
            out["rss_second"] = _rss_mib(broker.pid)
    finally:
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.producer_ids", description=__doc__)
    p.add_argument("--producers", type=int, default=100_000)
    p.add_argument("--expiration-ms", type=int, default=60_000, help="this tree's expiry")
    p.add_argument("--base-tree", type=Path, help="another source tree, measured alongside")
    args = p.parse_args(argv)
    trees: list[tuple[str, Path | None]] = [("this tree", None)]
    if args.base_tree is not None:
        trees.append(("base", args.base_tree))
    r = run_tree(None, args.producers, 0, plain=True)
    base_growth = (r["rss_after"] or 0.0) - (r["rss_before"] or 0.0)
    print(
        f"plain    : {args.producers} requests without a producer id: RSS"
        f" {_fmt(r['rss_before'])} -> {_fmt(r['rss_after'])} MiB (the log, its manifest, ...)",
        flush=True,
    )
    for name, tree in trees:
        r = run_tree(tree, args.producers, args.expiration_ms)
        before, after = r["rss_before"] or 0.0, r["rss_after"] or 0.0
        per = (after - before - base_growth) * (1 << 20) / args.producers
        line = (
            f"{name:9}: {args.producers} producers: RSS {before:.1f} -> {after:.1f} MiB"
            f" ({per:.0f} B per producer beyond the plain run),"
            f" producer_ids {_fmt(r['gauge_after'], '.0f')}"
        )
        if "rss_expired" in r:
            line += (
                f"; expired after {_fmt(r['expired_after_s'])} s: producer_ids"
                f" {_fmt(r['gauge_expired'], '.0f')}, RSS {_fmt(r['rss_expired'])} MiB;"
                f" {args.producers} new ones then: RSS {_fmt(r['rss_second'])} MiB"
            )
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
