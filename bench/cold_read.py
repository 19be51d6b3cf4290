"""Cold reads from S3: a consumer from the beginning of a partition whose segments are
only in the object store, against the S3 server's single-stream GET bandwidth, measured
in the same run (issue 13; docs/benchmarks.md).

``python -m bench.cold_read [--messages N] [--base-tree DIR] [--broker-arg=--FLAG=V]``:
starts SeaweedFS (``weed mini``) and a broker on it, produces ``N`` x 1 KiB (acks=all),
waits for merges, restarts the broker (an empty segment cache), has it take the
partition (a watermark query: its producer-state rebuild is not measured), then

1. consumes the partition from offset 0 with confluent-kafka: MB/s (of values), the CPU
   per MB of the broker, the S3 server and the consumer, and the time to the first
   message;
2. GETs every segment object of the partition one after another with one boto3 client
   (one stream, whole objects), before and after the consumes: MB/s of object bytes (the
   mean is the reference) and the CPU per MB of the S3 server and the client.

With ``--base-tree DIR`` the consume is repeated by a broker run from that source tree
(before the read-path changes) on the same bucket. Processes are stopped by PID.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.broker_run import create_topics
from bench.broker_targets import Target, broker_env, cpu_seconds, profiled, py_spy
from bench.broker_workers import run_worker
from bench.fs_probe import new_workdir

MSG = 1024


def _consume(
    bootstrap: str, topic: str, n: int, pid: int, fetch: int = 0, s3_pid: int | None = None
) -> dict[str, Any]:
    cpu, s3_cpu = cpu_seconds(pid), cpu_seconds(s3_pid)
    res = run_worker({"bootstrap": bootstrap, "size": MSG, "partitions": 1, "kind": "consume",
                      "topic": topic, "messages": n, "fetch_bytes": fetch})  # fmt: skip
    mb = res["bytes"] / 1e6
    res["cpu_ms_per_mb"] = (cpu_seconds(pid) - cpu) * 1000 / mb
    # the other two parties of a cold read, on the same cores: the S3 server's CPU over
    # the whole worker (its GETs), the consumer's over its timed loop
    res["s3_ms_per_mb"] = (cpu_seconds(s3_pid) - s3_cpu) * 1000 / mb
    res["client_ms_per_mb"] = res.get("cpu_seconds", 0.0) * 1000 / mb
    return res


def _take(bootstrap: str, topic: str) -> None:
    """Ask for the partition's watermarks: the restarted broker takes it (and rebuilds
    its producer state from the newest segments) here, not inside the timed consume's
    CPU figures (the take was outside its timing already)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-take", "log_level": 3})
    try:
        c.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
    finally:
        c.close()


def _cpu_line(res: dict[str, Any]) -> str:
    total = res["cpu_ms_per_mb"] + res["s3_ms_per_mb"] + res["client_ms_per_mb"]
    steady = res["steady_bytes"] / res["steady_seconds"] / 1e6 if res["steady_seconds"] else 0
    first = res["seconds"] - res["steady_seconds"]
    return (f"  CPU ms/MB: broker {res['cpu_ms_per_mb']:.1f} + S3 server "
            f"{res['s3_ms_per_mb']:.1f} + consumer {res['client_ms_per_mb']:.1f} = {total:.1f} "
            f"(all {os.cpu_count()} cores busy at {(os.cpu_count() or 1) * 1e3 / total:.0f} MB/s); "
            f"first message after {first * 1000:.0f} ms, {steady:.1f} MB/s from there")  # fmt: skip


def _single_stream(endpoint: Any, bucket: str, prefix: str) -> tuple[float, int]:
    from tests.fixtures.s3 import s3_client

    client = s3_client(endpoint)
    try:
        keys, sizes = [], []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            objs = [o for o in page.get("Contents", []) if o["Key"].endswith(".kfs")]
            keys += [o["Key"] for o in objs]
            sizes += [o["Size"] for o in objs]
        print("segment objects (MB):", " ".join(f"{s / 1e6:.1f}" for s in sizes))
        start, total = time.perf_counter(), 0
        s3_cpu, own = cpu_seconds(endpoint.pid), time.process_time()
        for key in sorted(keys):
            total += len(client.get_object(Bucket=bucket, Key=key)["Body"].read())
        mbs = total / (time.perf_counter() - start) / 1e6
        s3_ms = (cpu_seconds(endpoint.pid) - s3_cpu) * 1000 / (total / 1e6)
        own_ms = (time.process_time() - own) * 1000 / (total / 1e6)
        print(f"  single-stream GET {mbs:.1f} MB/s, CPU ms/MB: S3 server {s3_ms:.1f} + "
              f"client {own_ms:.1f} = {s3_ms + own_ms:.1f}")  # fmt: skip
        return mbs, len(keys)
    finally:
        client.close()


def _cold(b: Any, n: int, fetch: int, s3_pid: int | None) -> dict[str, Any]:
    """A cold consume by broker ``b`` started afresh (an empty cache), after its take."""
    b.start()
    try:
        _take(b.bootstrap, "cold")
        res = _consume(b.bootstrap, "cold", n, b.pid, fetch, s3_pid)
        res["load"] = os.getloadavg()[0]
        return res
    finally:
        b.stop()


Pairs = list[tuple[dict[str, Any], dict[str, Any]]]


def _pair(
    b: Any, base: Any, n: int, fetch: int, s3_pid: int | None, base_first: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One cold consume of this tree's broker and one of the base tree's, in the given order
    (alternated by the caller: order effects)."""
    if base_first:
        other = _cold(base, n, fetch, s3_pid)
        return _cold(b, n, fetch, s3_pid), other
    mine = _cold(b, n, fetch, s3_pid)
    return mine, _cold(base, n, fetch, s3_pid)


def _print_pairs(pairs: Pairs, gets: float) -> None:
    """Per round: this tree's and the base tree's cold consume (ratio to the mean
    single-stream GET, CPU per MB of broker / S3 server / consumer), then the medians."""
    print(f"alternating rounds (ratio to the single-stream GET {gets:.1f} MB/s):")
    cols: dict[str, list[float]] = {}
    for i, pair in enumerate(pairs):
        cells = []
        for name, res in zip(("this", "base"), pair, strict=True):
            mbs = res["bytes"] / res["seconds"] / 1e6
            vals = {
                "ratio": mbs / gets,
                "broker": res["cpu_ms_per_mb"],
                "s3": res.get("s3_ms_per_mb", 0.0),
                "client": res["client_ms_per_mb"],
            }
            for k, v in vals.items():
                cols.setdefault(f"{name} {k}", []).append(v)
            cells.append(
                f"{name} {mbs:.1f} MB/s ({vals['ratio']:.2f}), ms/MB broker {vals['broker']:.2f}"
                f" S3 {vals['s3']:.2f} consumer {vals['client']:.2f}"
            )
        print(f"  {i + 1}: {'; '.join(cells)}; load {pair[0].get('load', 0.0):.1f}")
    meds = ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in cols.items())
    print(f"  medians: {meds}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.cold_read", description=__doc__)
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--base-tree", type=Path)
    p.add_argument("--py-spy", type=Path, metavar="DIR", help="profile the cold consume")
    p.add_argument(
        "--fetch-bytes",
        type=int,
        default=0,
        help="the consumers' max.partition.fetch.bytes (default: librdkafka's 1 MiB)",
    )
    p.add_argument(
        "--store-param",
        action="append",
        default=[],
        metavar="K=V",
        help="extra S3 URL parameter for both brokers (e.g. parallel_gets=true)",
    )
    p.add_argument("--rounds", type=int, default=1,
                   help="with --base-tree: this many cold consumes of each broker, alternating "
                   "(each after a restart: an empty cache), and their medians")  # fmt: skip
    p.add_argument("--broker-arg", action="append", default=[],
                   help="extra flag for this tree's broker (e.g. --readahead-bytes=0)")  # fmt: skip
    return p


def _against_base(
    args: argparse.Namespace, b: Any, url: str, limits: list[str], s3_pid: int | None
) -> tuple[dict[str, Any], Pairs]:
    """The base tree's broker on the same bucket and metadata, then this tree's again
    (order effects), then ``--rounds - 1`` alternating pairs."""
    from tests.fixtures.broker import BrokerProcess, free_port

    port = free_port()
    bargs = ["--listen", f"127.0.0.1:{port}", "--store", url, *limits]
    bp = BrokerProcess(b.workdir, port, bargs, broker_env(args.base_tree)).start()
    try:
        _take(bp.bootstrap, "cold")
        base = _consume(bp.bootstrap, "cold", args.messages, bp.pid, args.fetch_bytes, s3_pid)
    finally:
        bp.stop()
    b.start()  # this tree's broker again, after the base tree's: order effects
    try:
        _take(b.bootstrap, "cold")
        res2 = _consume(b.bootstrap, "cold", args.messages, b.pid, args.fetch_bytes, s3_pid)
        res2["load"], base["load"] = os.getloadavg()[0], os.getloadavg()[0]
    finally:
        b.stop()
    mbs2 = res2["bytes"] / res2["seconds"] / 1e6
    print(f"cold consume again, after the base tree's: {mbs2:.1f} MB/s, broker CPU "
          f"{res2['cpu_ms_per_mb']:.1f} ms/MB")  # fmt: skip
    return base, [(res2, base)] + [
        _pair(b, bp, args.messages, args.fetch_bytes, s3_pid, r % 2 == 0)
        for r in range(1, args.rounds)
    ]


def _report(
    res: dict[str, Any],
    warm: dict[str, Any],
    base: dict[str, Any] | None,
    gets: tuple[float, float, int],
) -> None:
    gets0, gets1, n = gets
    mean = (gets0 + gets1) / 2  # the machine is shared: the mean of before and after
    mbs = res["bytes"] / res["seconds"] / 1e6
    print(f"single-stream GET: {mean:.1f} MB/s over {n} segment objects (before the "
          f"consumes {gets0:.1f}, after {gets1:.1f})")  # fmt: skip
    print(f"cold consume: {mbs:.1f} MB/s = {mbs / mean:.2f} of it, broker CPU "
          f"{res['cpu_ms_per_mb']:.1f} ms/MB")  # fmt: skip
    print(_cpu_line(res))
    wmbs = warm["bytes"] / warm["seconds"] / 1e6
    print(f"the same consume again (cached as far as the cache holds): {wmbs:.1f} MB/s, "
          f"broker CPU {warm['cpu_ms_per_mb']:.1f} ms/MB; cold/again {mbs / wmbs:.2f}")  # fmt: skip
    print(_cpu_line(warm))
    if base is not None:
        bmbs = base["bytes"] / base["seconds"] / 1e6
        print(f"cold consume, base tree: {bmbs:.1f} MB/s = {bmbs / mean:.2f}, broker CPU "
              f"{base['cpu_ms_per_mb']:.1f} ms/MB")  # fmt: skip
        print(_cpu_line(base))


def main(argv: list[str] | None = None) -> int:
    from tests.fixtures.broker import start_broker
    from tests.fixtures.s3 import create_bucket, run_seaweedfs

    args = _parser().parse_args(argv)
    if args.py_spy is not None:
        py_spy()  # before anything starts
    work = new_workdir("kafscale-cold-")
    limits = ["--cache-bytes", str(64 << 20), "--log-level", "WARNING", "--merge-min-age-ms", "0"]
    with run_seaweedfs() as ep:
        bucket = create_bucket(ep)
        url = ep.store_url(bucket, "bench") + "".join("&" + kv for kv in args.store_param)
        b = start_broker(work / "b", store_url=url, extra_args=(*limits, *args.broker_arg))
        try:
            create_topics(b.bootstrap, ["cold"], 1)
            spec = {"bootstrap": b.bootstrap, "size": MSG, "partitions": 1, "kind": "produce",
                    "topic": "cold", "messages": args.messages, "idempotence": False}  # fmt: skip
            run_worker(spec)
            time.sleep(3)  # merges of the small segments (interval 1 s) before the restart
            b.restart()  # an empty segment cache: everything is in S3 only
            _take(b.bootstrap, "cold")
            gets0, _ = _single_stream(ep, bucket, "bench/")  # before, and after, the consumes
            target = Target("cold", b.bootstrap, b.pid)
            with profiled(target, "consume", args.py_spy):
                res = _consume(b.bootstrap, "cold", args.messages, b.pid, args.fetch_bytes, ep.pid)
            # the same again: from the cache as far as it holds the partition (all of it
            # with --broker-arg=--cache-bytes=N above the partition's size): the client's
            # and machine's ceiling, in the same run
            warm = _consume(b.bootstrap, "cold", args.messages, b.pid, args.fetch_bytes, ep.pid)
        finally:
            b.stop()
        base = None
        if args.base_tree is not None:  # the same bucket and metadata, the older broker
            base, pairs = _against_base(args, b, url, limits, ep.pid)
        gets1, n = _single_stream(ep, bucket, "bench/")
        if args.base_tree is not None and args.rounds > 1:
            _print_pairs(pairs, (gets0 + gets1) / 2)
    _report(res, warm, base, (gets0, gets1, n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
