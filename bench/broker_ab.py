"""Paired A/B of one produce phase: a broker from another source tree (``--base-tree``)
and this tree's broker, both on the local store with embedded metadata, running side by
side; the phase alternates between them (``--rounds`` pairs, the order swapped every
round) and each trial's server CPU per MB comes from ``/proc``. On a shared machine the
paired differences say more than two medians taken minutes apart (docs/benchmarks.md,
"Round 2b").

    python -m bench.broker_ab --base-tree DIR [--rounds 10] [--messages 30000]
                              [--modes idem,plain,paced,paced_plain] [--local-arg=--FLAG=V ...]

``java`` / ``java_plain``: the Java client (kafka-clients 4.3, ``bench/java_client.py``;
idempotent / not), whose 16 KiB requests make the cost per request the figure.
``paced``: idempotent at 2,000 msg/s (at most 6,000 messages), p99 and p50 per trial;
``paced_plain``: the same without idempotence (requests pipelined). Both also print the
broker's own Produce p99 where the broker exports it (bench/broker_waits.py; not a base
tree from before round 4).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import uuid
from pathlib import Path
from typing import Any

from bench.broker_run import MSG_SIZE, create_topics, take_partitions
from bench.broker_targets import (
    BrokerLimits,
    Target,
    base_target,
    broker_target,
    cpu_seconds,
)
from bench.broker_waits import scrape_buckets, waits
from bench.broker_workers import run_worker
from bench.fs_probe import new_workdir

PACED = ("paced", "paced_plain")
PLAIN = ("plain", "paced_plain", "java_plain")  # the modes without idempotence


def _trial(t: Target, mode: str, messages: int, partitions: int = 1) -> tuple[float, ...]:
    """(server CPU ms per MB, MB/s) of one produce run of ``messages`` on a fresh topic of
    ``partitions``; ``paced`` / ``paced_plain``: (p99 ms, p50 ms, the broker's Produce p99
    ms or NaN) of an idempotent / plain run at 2,000 msg/s instead. A topic of several
    partitions is first taken by the broker, unmeasured (as in the partition sweep)."""
    topic = "ab-" + uuid.uuid4().hex[:8]
    create_topics(t.bootstrap, [topic], partitions)
    spec: dict[str, Any] = {"bootstrap": t.bootstrap, "size": MSG_SIZE,
                            "partitions": partitions, "kind": "produce", "topic": topic,
                            "messages": messages, "idempotence": mode not in PLAIN}  # fmt: skip
    if partitions > 1:
        take_partitions(run_worker, spec, [t])
    before = cpu_seconds(t.pid)
    if mode in PACED:
        spec.update(rate=2000, messages=min(messages, 6000))
    hist = scrape_buckets(t.metrics_url)
    if mode.startswith("java"):
        from bench.java_client import run_java

        res = run_java(spec)
    else:
        res = run_worker(spec)
    if mode in PACED:
        w = waits(hist, scrape_buckets(t.metrics_url))
        if "order_p99_ms" in w:  # what lies inside the broker's p99 (p99 of each, ms)
            parts = ("bytes", "wait", "put", "order", "commit", "lag")
            print(f"  {t.name}: " + ", ".join(f"{k} {w[f'{k}_p99_ms']:.1f}" for k in parts)
                  + f", merged {w.get('merged', '-')}", flush=True)  # fmt: skip
        return float(res["p99_ms"]), float(res["p50_ms"]), float(w.get("broker_p99_ms", math.nan))
    mb = res["bytes"] / 1e6
    return 1000 * (cpu_seconds(t.pid) - before) / mb, mb / res["seconds"]


def _summary(mode: str, rows: list[dict[str, tuple[float, ...]]]) -> str:
    base = [r["base"][0] for r in rows]
    new = [r["local"][0] for r in rows]
    diff = [r["local"][0] - r["base"][0] for r in rows]
    if mode in PACED:
        broker = {k: statistics.median(r[k][2] for r in rows) for k in ("base", "local")}
        return (
            f"{mode} 2,000 msg/s: p99 ms median base {statistics.median(base):.1f}, this tree "
            f"{statistics.median(new):.1f}; paired difference median "
            f"{statistics.median(diff):+.1f} (lower in {sum(d < 0 for d in diff)} of "
            f"{len(diff)}); p50 median base {statistics.median(r['base'][1] for r in rows):.1f}, "
            f"this tree {statistics.median(r['local'][1] for r in rows):.1f}; broker Produce "
            f"p99 median base {broker['base']:.1f}, this tree {broker['local']:.1f}"
        )
    return (
        f"{mode}: server CPU ms/MB median base {statistics.median(base):.2f}, "
        f"this tree {statistics.median(new):.2f}; paired difference median "
        f"{statistics.median(diff):+.2f} (lower in {sum(d < 0 for d in diff)} of {len(diff)}); "
        f"MB/s median base {statistics.median(r['base'][1] for r in rows):.1f}, "
        f"this tree {statistics.median(r['local'][1] for r in rows):.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.broker_ab", description=__doc__)
    p.add_argument("--base-tree", type=Path, required=True)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--messages", type=int, default=30_000)
    p.add_argument("--modes", default="idem,plain",
                   help="idem, plain, java, java_plain, paced and/or paced_plain")  # fmt: skip
    p.add_argument("--local-arg", action="append", default=[],
                   help="extra broker flag for this tree's broker only (e.g. the base tree "
                        "= this tree, to A/B one setting)")  # fmt: skip
    p.add_argument(
        "--cycles",
        type=int,
        help="flush cycles in flight of this tree's broker (bench.cycles_broker)",
    )
    p.add_argument(
        "--switch-ms",
        type=float,
        help="thread switch interval of this tree's broker (bench.cycles_broker)",
    )
    p.add_argument("--partitions", type=int, default=1,
                   help="partitions of each trial's topic (taken first, unmeasured)")  # fmt: skip
    args = p.parse_args(argv)
    workdir = new_workdir("kafscale-ab-")
    limits = BrokerLimits()
    with contextlib.ExitStack() as stack:
        base = stack.enter_context(base_target(workdir / "base", args.base_tree, limits, []))
        if args.cycles is not None or args.switch_ms is not None:
            from bench.broker_ab_s3 import _cycles_target
            from broker.flush import MAX_CYCLES_IN_FLIGHT

            cycles = args.cycles or MAX_CYCLES_IN_FLIGHT
            new = stack.enter_context(
                _cycles_target(workdir / "local", None, limits, cycles, args.switch_ms)
            )
        else:
            new = stack.enter_context(
                broker_target("local", workdir / "local", None, limits, args.local_arg)
            )
        run_pairs(base, new, args.modes.split(","), args.rounds, args.messages, args.partitions)
    return 0


def run_pairs(
    base: Target, new: Target, modes: list[str], rounds: int, messages: int, partitions: int = 1
) -> None:
    """Warm both up, then per mode ``rounds`` trials of each, the order swapped every
    round; prints every pair and each mode's summary."""
    for t in (base, new):  # warm up: imports, producer ids, the first segment
        _trial(t, "idem", 2000)
    for mode in modes:
        rows: list[dict[str, Any]] = []
        for r in range(rounds):
            order = (base, new) if r % 2 == 0 else (new, base)
            rows.append({t.name: _trial(t, mode, messages, partitions) for t in order})
            unit = ("p99 ms", "p50 ms") if mode in PACED else ("ms/MB", "MB/s")
            got = {k: f"{v[0]:.2f} {unit[0]} {v[1]:.1f} {unit[1]}"
                      + (f" broker p99 {v[2]:.1f}" if len(v) > 2 else "")
                   for k, v in rows[-1].items()}  # fmt: skip
            print(mode, r, got, flush=True)
        print(_summary(mode, rows), flush=True)


if __name__ == "__main__":
    sys.exit(main())
