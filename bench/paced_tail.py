"""Where a paced producer's latency tail comes from (docs/benchmarks.md, "Round 19").

    python -m bench.paced_tail [--rate 2000] [--seconds 30] [--rounds 3] [--idempotent]
                               [--burst-mb 0] [--scrape-s 0] [--lag-partitions 0]
                               [--base-tree DIR]
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
of its segments (docs/benchmarks.md, "Round 20"). ``--scrape-s S``: meanwhile a process
of its own GETs the broker's ``/metrics`` every S seconds (as Prometheus would; the body
is read, not parsed; the report gives the lines of the last body). ``--lag-partitions N``:
first a topic of N partitions, a record in each and a consumer group's offset committed
on each, so that ``/metrics`` carries a lag series and a committed-offset series per
partition, as a broker coordinating groups over many partitions does (docs/benchmarks.md,
"Round 21"). The medians and their ratios close the report. Processes are stopped by PID.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.alternating import alternate
from bench.broker_run import create_topics
from bench.broker_targets import BrokerLimits, base_target, broker_target, cpu_seconds
from bench.broker_workers import pace
from bench.stats import percentile

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
        pace(p, start + i / rate)
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


_SCRAPER = """
import sys, time, urllib.request
url, every, n = sys.argv[1], float(sys.argv[2]), 0
while True:
    time.sleep(every)
    with urllib.request.urlopen(url, timeout=30) as resp:
        body = resp.read()
    n += 1
    print(n, body.count(b"\\n"), body.count(b"\\nkafscale_group_lag{"), flush=True)
"""


@contextlib.contextmanager
def scraping(url: str | None, every_s: float) -> Iterator[list[int]]:
    """GET ``url`` every ``every_s`` seconds from a process of its own (as Prometheus
    would: not in the producer's process, whose GIL it would share) while the block runs;
    not at all when ``every_s`` is 0. Yields a list that holds, once the block ends, the
    number of scrapes, the lines of the last body and its ``kafscale_group_lag`` series.
    The process is stopped by its PID."""
    counted: list[int] = []
    if every_s <= 0:
        yield counted
        return
    if url is None:
        raise ValueError("the broker serves no /metrics to scrape")
    proc = subprocess.Popen([sys.executable, "-c", _SCRAPER, url, str(every_s)],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        yield counted
    finally:
        proc.terminate()
        out, _err = proc.communicate(timeout=30)
        last = out.splitlines()[-1].split() if out.strip() else ["0", "0", "0"]
        counted.extend(int(v) for v in last)


def lagged_group(bootstrap: str, partitions: int) -> None:
    """A topic ``lagged`` of ``partitions`` partitions with one record in each, and the
    group ``lagged`` with offset 0 committed on every one (a lag of 1 each)."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    create_topics(bootstrap, ["lagged"], partitions)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "log_level": 3})
    for part in range(partitions):
        p.produce("lagged", b"x", partition=part)
    if p.flush(60):
        raise RuntimeError("lagged records not delivered")
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "lagged",
                  "enable.auto.commit": False, "log_level": 3})  # fmt: skip
    try:
        offsets = [TopicPartition("lagged", part, 0) for part in range(partitions)]
        c.assign(offsets)
        c.commit(offsets=offsets, asynchronous=False)
    finally:
        c.close()


def trial(tree: Path | None, args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    limits = BrokerLimits()
    extra = list(args.broker_arg)
    target = (base_target(workdir, tree, limits, extra) if tree is not None
              else broker_target("local", workdir, None, limits, extra))  # fmt: skip
    with target as t:
        create_topics(t.bootstrap, ["paced", "burst"], 1)
        if args.burst_mb:
            burst(t.bootstrap, args.burst_mb)
        if args.lag_partitions:
            lagged_group(t.bootstrap, args.lag_partitions)
        cpu = cpu_seconds(t.pid)
        with scraping(t.metrics_url, args.scrape_s) as scrapes:
            res = produce(t.bootstrap, args.rate, args.seconds, args.idempotent)
        cpu = cpu_seconds(t.pid) - cpu
    lat = sorted(latency for _sent, latency in res)
    runs = stalls(res)
    return {
        "p50_ms": 1000 * percentile(lat, 0.5),
        "p99_ms": 1000 * percentile(lat, 0.99),
        "max_ms": 1000 * lat[-1],
        "cpu_ms_mb": 1000 * cpu / (len(lat) * 1024 / 1e6),
        "stalls": float(len(runs)),
        "stalls_20": float(sum(n >= 20 for n in runs)),
        "scrapes": float(scrapes[0]) if scrapes else 0.0,
        "scrape_lines": float(scrapes[1]) if scrapes else 0.0,
        "lag_series": float(scrapes[2]) if scrapes else 0.0,
    }


def _fmt(r: dict[str, float]) -> str:
    return (f"p50 {r['p50_ms']:.1f} / p99 {r['p99_ms']:.1f} / max {r['max_ms']:.1f} ms, "
            f"CPU {r['cpu_ms_mb']:.1f} ms/MB, {r['stalls']:.0f} stalls "
            f"({r['stalls_20']:.0f} of 20+ messages), {r['scrapes']:.0f} scrapes "
            f"of {r['scrape_lines']:.0f} lines")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.paced_tail", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--rate", type=float, default=2000.0, help="messages (1 KiB) a second")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--idempotent", action="store_true")
    ap.add_argument("--burst-mb", type=float, default=0.0,
                    help="MB at full speed to another topic just before the paced run")  # fmt: skip
    ap.add_argument("--scrape-s", type=float, default=0.0,
                    help="GET the broker's /metrics this often during the paced run")  # fmt: skip
    ap.add_argument("--lag-partitions", type=int, default=0,
                    help="a group's lag on this many partitions, in /metrics")  # fmt: skip
    ap.add_argument("--base-tree", type=Path, help="another source tree, run alongside")
    ap.add_argument("--broker-arg", action="append", default=[], help="extra broker flag")
    args = ap.parse_args(argv)
    alternate(lambda tree, wd: trial(tree, args, wd), args.base_tree, args.rounds, _fmt,
              ("p99_ms", "max_ms", "cpu_ms_mb"), "kafscale-paced-")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
