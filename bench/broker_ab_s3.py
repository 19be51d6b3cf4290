"""Paired A/B of one produce phase on S3 (SeaweedFS, ``weed mini``): two brokers side by
side on one SeaweedFS (a bucket each, embedded metadata), the phase alternated between
them as in ``bench.broker_ab`` (the order swapped every round); server CPU per MB from
``/proc`` (docs/benchmarks.md, "Round 3: S3 produce").

    python -m bench.broker_ab_s3 [--base-tree DIR] [--base-params K=V,...] [--cycles N]
                                 [--rounds 10] [--messages 30000]
                                 [--modes idem,plain,paced,paced_plain]

``base``: the broker of ``--base-tree`` (e.g. an export of main), or without it this tree's
broker with ``--base-params`` added to its store URL (e.g. ``direct_puts=false``: the SDK's
PUTs); ``local``: this tree's broker with the defaults, or with ``--cycles N`` flush cycles
in flight (``bench.cycles_broker``; the default is ``broker.flush.MAX_CYCLES_IN_FLIGHT``).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bench.broker_ab import run_pairs
from bench.broker_targets import (
    S3_VOLUME_MB,
    BrokerLimits,
    Target,
    base_target,
    broker_target,
    flush_interval_ms,
)


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
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="kafscale-ab-s3-"))
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
                    ["--store", base_url, "--workers", "1"],
                )
            )
        else:
            base = stack.enter_context(broker_target("base", workdir / "b", base_url, limits, []))
        if args.cycles is not None:
            new = stack.enter_context(_cycles_target(workdir / "n", new_url, limits, args.cycles))
        else:
            new = stack.enter_context(broker_target("local", workdir / "n", new_url, limits, []))
        run_pairs(base, new, args.modes.split(","), args.rounds, args.messages)
    return 0


if __name__ == "__main__":
    sys.exit(main())
