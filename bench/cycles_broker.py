"""``kafscale broker`` with ``broker.flush.MAX_CYCLES_IN_FLIGHT`` set from the environment
(``BENCH_CYCLES``): for ``bench.broker_ab_s3 --cycles N``, whether the flush cycles in
flight bound S3 produce throughput (docs/benchmarks.md, "Round 3: S3 produce"); and
``BENCH_SWITCH_MS``: the interpreter's thread switch interval (``sys.setswitchinterval``,
5 ms by default), for ``bench.broker_ab --switch-ms X`` (docs/benchmarks.md, "Round 4:
paced p99")."""

from __future__ import annotations

import os
import sys

import broker.flush
from broker.cli import main

if __name__ == "__main__":
    broker.flush.MAX_CYCLES_IN_FLIGHT = int(os.environ.get("BENCH_CYCLES", "2"))
    if switch_ms := os.environ.get("BENCH_SWITCH_MS"):
        sys.setswitchinterval(float(switch_ms) / 1000)
    sys.exit(main())
