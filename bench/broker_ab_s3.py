"""Paired A/B of one produce phase on S3 (SeaweedFS, ``weed mini``): two brokers side by
side on one SeaweedFS (a bucket each, embedded metadata), the phase alternated between
them as in ``bench.broker_ab`` (the order swapped every round); server CPU per MB from
``/proc`` (docs/benchmarks.md, "Round 3: S3 produce").

    python -m bench.broker_ab_s3 [--base-tree DIR] [--base-params K=V,...] [--cycles N]
                                 [--rounds 10] [--messages 30000]
                                 [--modes idem,plain,paced,paced_plain]
                                 [--window S] [--broker-arg=--F=V] [--base-arg=--F=V]

``base``: the broker of ``--base-tree`` (e.g. an export of main), or without it this tree's
broker with ``--base-params`` added to its store URL (e.g. ``direct_puts=false``: the SDK's
PUTs); ``local``: this tree's broker with the defaults, or with ``--cycles N`` flush cycles
in flight (``bench.cycles_broker``; the default is ``broker.flush.MAX_CYCLES_IN_FLIGHT``).
``--broker-arg``: a flag for both brokers, ``--base-arg``: for base only (e.g. base = this
tree with another setting).

``--window S`` (docs/benchmarks.md, "Round 4: SeaweedFS's cost per MB"): each trial is
one produce and what follows it until S seconds from its start (the broker's merges and,
with a deletion grace shorter than S, its deletes: the cost of those bytes that lands
after the produce); per trial the broker's and SeaweedFS's CPU per MB over the window
and the produce's MB/s.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from bench.broker_ab import run_pairs
from bench.broker_run import MSG_SIZE, create_topics
from bench.broker_targets import (
    S3_VOLUME_MB,
    BrokerLimits,
    Target,
    base_target,
    broker_target,
    cpu_seconds,
    flush_interval_ms,
)
from bench.broker_workers import run_worker
from bench.fs_probe import new_workdir


@contextlib.contextmanager
def _cycles_target(
    workdir: Path,
    url: str | None,
    limits: BrokerLimits,
    cycles: int,
    switch_ms: float | None = None,
) -> Iterator[Target]:
    """This tree's broker on ``url`` (None: the local store) with ``cycles`` flush cycles
    in flight (and ``switch_ms``: the interpreter's thread switch interval)."""
    from tests.fixtures.broker import free_port, start_broker

    http = free_port()
    args = ("--http", f"127.0.0.1:{http}", "--log-level", "WARNING", *limits.args())
    env = {"BENCH_CYCLES": str(cycles)}
    if switch_ms is not None:
        env["BENCH_SWITCH_MS"] = str(switch_ms)
    broker = start_broker(
        workdir, store_url=url, extra_args=args, env=env, module="bench.cycles_broker"
    )
    try:
        yield Target("local", broker.bootstrap, broker.pid, f"http://127.0.0.1:{http}/metrics",
                     limits.broker_inflight_bytes + limits.cache_bytes,
                     flush_interval_ms([], url is not None))  # fmt: skip
    finally:
        broker.stop()


def _window_trial(t: Target, mode: str, messages: int, window: float) -> tuple[float, ...]:
    """(broker CPU ms/MB, SeaweedFS CPU ms/MB, MB/s): one produce, CPU over ``window`` s."""
    topic = "ab-" + uuid.uuid4().hex[:8]
    create_topics(t.bootstrap, [topic], 1)
    cpu, store = cpu_seconds(t.pid), cpu_seconds(t.store_pid)
    start = time.monotonic()
    res = run_worker({"bootstrap": t.bootstrap, "size": MSG_SIZE, "partitions": 1,
                      "kind": "produce", "topic": topic, "messages": messages,
                      "idempotence": mode != "plain"})  # fmt: skip
    time.sleep(max(0.0, window - (time.monotonic() - start)))  # the bytes' follow-up work
    mb = res["bytes"] / 1e6
    return (1000 * (cpu_seconds(t.pid) - cpu) / mb,
            1000 * (cpu_seconds(t.store_pid) - store) / mb, mb / res["seconds"])  # fmt: skip


def run_window_pairs(
    base: Target, new: Target, modes: list[str], rounds: int, messages: int, window: float
) -> None:
    """``run_pairs`` with ``_window_trial``: the order swapped every round."""
    for t in (base, new):
        _window_trial(t, "idem", 2000, 0)
    for mode in modes:
        rows: list[dict[str, tuple[float, ...]]] = []
        for r in range(rounds):
            order = (base, new) if r % 2 == 0 else (new, base)
            rows.append({t.name: _window_trial(t, mode, messages, window) for t in order})
            print(mode, r, {k: "broker {:.2f} ms/MB, SeaweedFS {:.2f} ms/MB, {:.1f} MB/s"
                            .format(*v) for k, v in rows[-1].items()}, flush=True)  # fmt: skip
        for i, what in enumerate(("broker CPU ms/MB", "SeaweedFS CPU ms/MB", "MB/s")):
            b = [row["base"][i] for row in rows]
            n = [row["local"][i] for row in rows]
            d = [y - x for x, y in zip(b, n, strict=True)]
            print(f"{mode}: {what} (window {window:g} s) median base {statistics.median(b):.2f}, "
                  f"this tree {statistics.median(n):.2f}; paired difference median "
                  f"{statistics.median(d):+.2f} (lower in {sum(x < 0 for x in d)} of {len(d)})",
                  flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    from tests.fixtures.s3 import create_bucket, run_seaweedfs

    p = argparse.ArgumentParser(prog="python -m bench.broker_ab_s3", description=__doc__)
    p.add_argument("--base-tree", type=Path)
    p.add_argument("--base-params", default="", help="K=V,... added to base's store URL")
    p.add_argument("--cycles", type=int, help="flush cycles in flight of this tree's broker")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--messages", type=int, default=30_000)
    p.add_argument("--modes", default="idem,plain",
                   help="idem, plain, paced and/or paced_plain")  # fmt: skip
    p.add_argument("--window", type=float, help="seconds per trial: produce + follow-up")
    p.add_argument("--broker-arg", action="append", default=[], help="a flag for both")
    p.add_argument("--base-arg", action="append", default=[], help="a flag for base only")
    args = p.parse_args(argv)
    workdir = new_workdir("kafscale-ab-s3-")
    limits = BrokerLimits()
    with contextlib.ExitStack() as stack:
        endpoint = stack.enter_context(run_seaweedfs(S3_VOLUME_MB))
        base_url = endpoint.store_url(create_bucket(endpoint), "bench")
        new_url = endpoint.store_url(create_bucket(endpoint), "bench")
        for kv in filter(None, args.base_params.split(",")):
            base_url += "&" + kv
        if args.base_tree is not None:
            base = stack.enter_context(
                base_target(
                    workdir / "base",
                    args.base_tree,
                    limits,
                    ["--store", base_url, "--workers", "1", *args.broker_arg, *args.base_arg],
                )
            )
        else:
            base = stack.enter_context(
                broker_target(
                    "base", workdir / "b", base_url, limits, [*args.broker_arg, *args.base_arg]
                )
            )
        if args.cycles is not None:
            new = stack.enter_context(_cycles_target(workdir / "n", new_url, limits, args.cycles))
        else:
            new = stack.enter_context(
                broker_target("local", workdir / "n", new_url, limits, list(args.broker_arg))
            )
        base.store_pid = new.store_pid = endpoint.pid
        if args.window is not None:
            run_window_pairs(
                base, new, args.modes.split(","), args.rounds, args.messages, args.window
            )
        else:
            run_pairs(base, new, args.modes.split(","), args.rounds, args.messages)
    return 0


if __name__ == "__main__":
    sys.exit(main())
