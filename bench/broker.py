"""Data-plane benchmark: this broker (local store, SeaweedFS S3) versus librdkafka's mock.

Run ``python -m bench.broker [--quick]`` from the repository root (``--help`` for more).
For every target it measures, with confluent-kafka and 1 KiB values, acks=all:

- produce throughput (MB/s, msg/s) and per-message delivery-report latency (p50/p99),
  without and with idempotence (the Java client's default), at full speed;
- produce latency at a fixed, moderate rate (idempotent), where queueing does not dominate;
- consume throughput (MB/s, msg/s) from the beginning of the produced data;
- for the broker targets: the broker's RSS (``/proc/PID/status``) sampled through the
  whole run, against its configured buffer limits (broker in-flight bytes + cache bytes),
  and the peaks of its ``/metrics`` gauges.

Each producer and consumer runs in its own process (``python -m bench.broker worker
SPEC``) so the clients never share a GIL with each other or with the orchestrator. The
mock cluster lives in a producer of a separate host process (``test.mock.num.brokers``);
its bootstrap address is read from that client's metadata and the load workers connect
to it exactly as they connect to the broker. MB means 10^6 bytes of message values.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
from pathlib import Path

from bench.broker_goals import format_flatness, format_goals
from bench.broker_plot import plot
from bench.broker_report import format_table
from bench.broker_run import FULL, QUICK, Plan, run_targets, warm_up
from bench.broker_sweep import format_sweep, run_partition_sweep, run_sweep
from bench.broker_targets import (
    CYCLE_ARGS,
    MIB,
    SHARED_ARGS,
    TARGETS,
    BrokerLimits,
    Target,
    base_target,
    broker_target,
    etcd_target,
    mock_target,
    py_spy,
    s3_target,
)
from bench.broker_workers import worker_main
from bench.fs_probe import creation_ms, describe, new_workdir


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.broker", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="~1 minute run (smaller volumes)")
    p.add_argument("--targets", default="local,s3,mock",
                   help=f"subset of {','.join(TARGETS)}")  # fmt: skip
    p.add_argument("--workers", type=int, default=2,
                   help="processes of the 'workers' target (etcd, local store)")  # fmt: skip
    p.add_argument("--messages", type=int, help="messages per full-speed run")
    p.add_argument("--rounds", type=int, help="rounds (median kept); default 1 quick, 3 full")
    p.add_argument("--partitions", type=int, help="partitions per topic (default 1)")
    p.add_argument("--compression", default="none",
                   help="producers' compression.type (values then half random)")  # fmt: skip
    p.add_argument(
        "--client-nice",
        type=int,
        default=0,
        metavar="N",
        help="run the clients at nice N (19: librdkafka's idempotent producer's "
        "busy poll takes only idle CPU, as on a host of its own)",
    )
    p.add_argument("--cache-bytes", type=int, default=64 * MIB)
    p.add_argument("--broker-inflight-bytes", type=int,
                   default=64 * MIB)  # fmt: skip
    p.add_argument(
        "--broker-arg",
        action="append",
        default=[],
        help="extra flag for both broker targets, e.g. --broker-arg=--flush-bytes=N",
    )
    p.add_argument("--local-arg", action="append", default=[], help="extra flag, local only")
    p.add_argument("--s3-arg", action="append", default=[], help="extra flag, S3 only")
    p.add_argument("--json", type=Path, help="also write the raw results here")
    p.add_argument(
        "--sweep",
        metavar="RATES",
        help="instead: produce at these offered msg/s (comma list, 0 = full speed)",
    )
    p.add_argument("--base-tree", type=Path,
                   help="source tree of the 'base' target (the local broker before)")  # fmt: skip
    p.add_argument("--partition-sweep", metavar="COUNTS",
                   help="instead: idempotent produce over N partitions (comma list)")  # fmt: skip
    p.add_argument("--sweep-client", choices=("librdkafka", "java"), default="librdkafka",
                   help="the partition sweep's producer (java: bench/java_client.py)")  # fmt: skip
    p.add_argument("--sweep-seconds", type=float, default=3.0, help="seconds per sweep rate")
    p.add_argument("--plot", type=Path, metavar="PNG", help="with --sweep: draw it here")
    p.add_argument(
        "--py-spy",
        type=Path,
        metavar="DIR",
        help="profile the broker per phase with py-spy into DIR (collapsed stacks)",
    )
    return p  # fmt: skip


def _open_target(
    name: str, stack: contextlib.ExitStack, workdir: Path, limits: BrokerLimits,
    args: argparse.Namespace,
) -> Target:  # fmt: skip
    if name == "mock":
        return stack.enter_context(mock_target())
    if name == "base":
        if args.base_tree is None:
            raise SystemExit("target 'base' needs --base-tree PATH")
        extra = [*args.broker_arg, *args.local_arg]
        return stack.enter_context(base_target(workdir / name, args.base_tree, limits, extra))
    layout = {"etcdshared": SHARED_ARGS, "s3shared": SHARED_ARGS, "shared": SHARED_ARGS,
              "etcdcycles": CYCLE_ARGS, "s3cycles": CYCLE_ARGS}.get(name, [])  # fmt: skip
    if name in ("etcd", "etcdshared", "etcdcycles", "workers"):
        workers = args.workers if name == "workers" else 1
        extra = [*args.broker_arg, *args.local_arg, *layout]
        return stack.enter_context(etcd_target(name, workdir / name, limits, extra, workers))
    if name in ("s3", "s3shared", "s3cycles"):
        extra = [*args.broker_arg, *args.s3_arg, *layout]
        return stack.enter_context(s3_target(workdir / name, limits, extra, name))
    extra = [*args.broker_arg, *args.local_arg, *layout]
    return stack.enter_context(broker_target(name, workdir / name, None, limits, extra))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["worker"]:
        return worker_main(json.loads(argv[1]))
    args = _parser().parse_args(argv)
    plan = QUICK if args.quick else FULL
    plan = Plan(
        args.messages or plan.messages, plan.paced_rate, plan.paced_seconds,
        args.partitions or plan.partitions, args.compression, args.client_nice,
    )  # fmt: skip
    if plan.partitions < 1:
        raise SystemExit("--partitions must be 1 or more")
    limits = BrokerLimits(args.cache_bytes, args.broker_inflight_bytes)
    names = [t.strip() for t in args.targets.split(",") if t.strip()]
    if unknown := set(names) - set(TARGETS):
        raise SystemExit(f"unknown targets: {sorted(unknown)}")
    if args.partition_sweep and args.sweep_client == "java" and "mock" in names:
        raise SystemExit(
            "--sweep-client java cannot produce to the mock cluster (kafka-clients 4.3 never "
            "sees its topics in its metadata); leave mock out of --targets"
        )
    if args.py_spy is not None:
        py_spy()  # before any target starts
        args.py_spy.mkdir(parents=True, exist_ok=True)
    rounds = args.rounds or (1 if args.quick else 3)
    workdir = new_workdir("kafscale-bench-")
    try:
        with contextlib.ExitStack() as stack:
            targets = [_open_target(n, stack, workdir, limits, args) for n in names]
            create_ms = creation_ms(workdir)  # printed with every report (bench/fs_probe.py)
            if args.sweep:
                return _sweep(targets, plan, args, create_ms)
            if args.partition_sweep:
                counts = [int(c) for c in args.partition_sweep.split(",")]
                sweep = run_partition_sweep(targets, counts, plan.messages, args.sweep_client)
                print(describe(create_ms))
                print(format_flatness(sweep))
                if args.json is not None:
                    out = {"partition_sweep": sweep, "fs_create_ms": create_ms}
                    args.json.write_text(json.dumps(out, indent=1))
                return 0
            results = run_targets(targets, plan, rounds, args.py_spy)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(format_table(results, plan))
    print(describe(create_ms))
    print(format_goals(results))
    if args.json is not None:
        out = {"plan": plan.__repr__(), "results": results, "fs_create_ms": create_ms}
        args.json.write_text(json.dumps(out, indent=1))
    return 0


def _sweep(targets: list[Target], plan: Plan, args: argparse.Namespace, create_ms: float) -> int:
    rates = [int(r) for r in args.sweep.split(",")]
    for t in targets:
        warm_up(t, plan)
    sweep = run_sweep(targets, plan, rates, args.sweep_seconds)
    print()
    print(format_sweep(sweep))
    print(describe(create_ms))
    if args.json is not None:
        out = {"plan": repr(plan), "sweep": sweep, "fs_create_ms": create_ms}
        args.json.write_text(json.dumps(out, indent=1))
    if args.plot is not None and plot(
        sweep,
        args.plot,
        f"produce (idempotent, acks=all, 1 KiB, {plan.partitions} partition(s))"
        " against offered load; same run, shared 2-core machine",
    ):
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
