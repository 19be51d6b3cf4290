"""Where a paced producer's latency tail comes from (docs/benchmarks.md, "Round 19").

    python -m bench.paced_tail [--rate 2000] [--seconds 30] [--rounds 3] [--idempotent]
                               [--burst-mb 0] [--base-tree DIR]
                               [--broker-arg=--merge-interval-ms=0]

Per trial a fresh broker (local store, embedded metadata; from ``--base-tree`` too, the
two alternating) gets a one-partition topic, and one confluent-kafka producer (acks=all,
``linger.ms`` 5, plain unless ``--idempotent``) sends ``--rate`` x 1 KiB messages a
second for ``--seconds``. Printed per trial: the delivery latency's p50 / p99 / max, the
broker's CPU per MB, and the *stalls*: runs of consecutive messages (sent less than
10 ms apart) that all took more than 10 ms, with how many of them held 20 messages or
more. A stall that recurs once per maintenance pass is background work in the way of the
flush cycles. ``--burst-mb N``: first N MB at full speed to another topic (a plain
producer, as ``bench.broker``'s produce phase), so that the paced run overlaps the merges
of its segments (docs/benchmarks.md, "Round 20"). The medians and their ratios close the
report. Processes are stopped by PID.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.broker_run import create_topics
from bench.broker_targets import BrokerLimits, base_target, broker_target, cpu_seconds

SLOW_S = 0.010  # a message slower than this is part of a stall


def stalls(sent_and_latency: list[tuple[float, float]]) -> list[int]:
    """The sizes (messages) of the runs of slow messages, in send order: a slow message
    sent within 10 ms of the previous slow one belongs to the same run."""
    runs: list[int] = []
    last = None
    for sent, latency in sorted(sent_and_latency):
        if latency <= SLOW_S:
            continue
        if last is not None and sent - last < SLOW_S and runs:
            runs[-1] += 1
        else:
            runs.append(1)
        last = sent
    return runs


def produce(
    bootstrap: str, rate: float, seconds: float, idempotent: bool
) -> list[tuple[float, float]]:
    """(send time, delivery latency) of every message, paced at ``rate``."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                  "enable.idempotence": idempotent, "log_level": 3})  # fmt: skip
    payload = os.urandom(1024)
    p.produce("paced", payload, partition=0)
    p.flush(30)
    out: list[tuple[float, float]] = []
    start = time.perf_counter()
    for i in range(int(rate * seconds)):
        while (wait := start + i / rate - time.perf_counter()) > 0:
            p.poll(wait)
        sent = time.perf_counter() - start

        def done(err: Any, msg: Any, sent: float = sent) -> None:
            if err is not None:
                raise RuntimeError(f"produce failed: {err}")
            out.append((sent, msg.latency() or 0.0))

        p.produce("paced", payload, partition=0, on_delivery=done)
    if p.flush(60):
        raise RuntimeError("messages left undelivered")
    return out


def burst(bootstrap: str, megabytes: float) -> None:
    """``megabytes`` of 1 KiB messages to the topic ``burst`` at full speed (acks=all)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                  "enable.idempotence": False, "log_level": 3})  # fmt: skip
    payload = os.urandom(1024)
    failed: list[str] = []

    def done(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    for _ in range(int(megabytes * 1e6 / len(payload))):
        while True:
            try:
                p.produce("burst", payload, partition=0, on_delivery=done)
                break
            except BufferError:  # the client's queue is full: let it drain
                p.poll(0.005)
    if p.flush(120) or failed:
        raise RuntimeError(f"burst not delivered: {failed[:1] or 'messages left'}")


def trial(tree: Path | None, args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    limits = BrokerLimits()
    extra = list(args.broker_arg)
    target = (base_target(workdir, tree, limits, extra) if tree is not None
              else broker_target("local", workdir, None, limits, extra))  # fmt: skip
    with target as t:
        create_topics(t.bootstrap, ["paced", "burst"], 1)
        if args.burst_mb:
            burst(t.bootstrap, args.burst_mb)
        cpu = cpu_seconds(t.pid)
        res = produce(t.bootstrap, args.rate, args.seconds, args.idempotent)
        cpu = cpu_seconds(t.pid) - cpu
    lat = sorted(latency for _sent, latency in res)
    runs = stalls(res)
    return {
        "p50_ms": 1000 * lat[len(lat) // 2],
        "p99_ms": 1000 * lat[int(0.99 * (len(lat) - 1))],
        "max_ms": 1000 * lat[-1],
        "cpu_ms_mb": 1000 * cpu / (len(lat) * 1024 / 1e6),
        "stalls": float(len(runs)),
        "stalls_20": float(sum(n >= 20 for n in runs)),
    }


def _fmt(r: dict[str, float]) -> str:
    return (f"p50 {r['p50_ms']:.1f} / p99 {r['p99_ms']:.1f} / max {r['max_ms']:.1f} ms, "
            f"CPU {r['cpu_ms_mb']:.1f} ms/MB, {r['stalls']:.0f} stalls "
            f"({r['stalls_20']:.0f} of 20+ messages)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.paced_tail", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--rate", type=float, default=2000.0, help="messages (1 KiB) a second")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--idempotent", action="store_true")
    ap.add_argument("--burst-mb", type=float, default=0.0,
                    help="MB at full speed to another topic just before the paced run")  # fmt: skip
    ap.add_argument("--base-tree", type=Path, help="another source tree, run alongside")
    ap.add_argument("--broker-arg", action="append", default=[], help="extra broker flag")
    args = ap.parse_args(argv)
    trees: list[tuple[str, Path | None]] = [("this tree", None)]
    if args.base_tree is not None:
        trees.append(("base", args.base_tree.resolve()))
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    for rnd in range(args.rounds):
        order = trees if rnd % 2 == 0 else trees[::-1]
        for name, tree in order:
            with tempfile.TemporaryDirectory(prefix="kafscale-paced-") as wd:
                r = trial(tree, args, Path(wd))
            results[name].append(r)
            print(f"round {rnd + 1}, {name}: {_fmt(r)}", flush=True)
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
           for name, rs in results.items()}  # fmt: skip
    for name, m in med.items():
        print(f"median, {name}: {_fmt(m)}")
    if "base" in med:
        ours, base = med["this tree"], med["base"]
        keys = ("p99_ms", "max_ms", "cpu_ms_mb")
        ratios = ", ".join(f"{k} {ours[k] / base[k]:.2f}" for k in keys if base[k])
        print(f"ratio this tree / base: {ratios}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
