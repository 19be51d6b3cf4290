"""Observability benchmarks (issue 11; figures in docs/benchmarks.md). Not tests.

``python -m bench.obs cost [--rounds N --messages N]``: the cost of the per-request
histograms. Full-speed produce (confluent-kafka, 1 KiB values, acks=all, one producer
process) against a broker with them and one without (``bench.nometrics_broker``),
alternating A/B/A/B so that the busy machine's drift hits both alike; medians reported.

``python -m bench.obs cpu [--rates 500,1000,...] [--seconds S]``: produce latency against
the broker's CPU, for the HPA's CPU target. One broker; each step produces at a fixed
rate for S seconds and reads the broker's CPU time (``/proc/PID/stat``) and its Produce
p50/p99 (the ``kafscale_request_duration_seconds`` histogram's increase over the step,
interpolated within buckets as ``histogram_quantile`` does).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.broker_workers import run_worker
from tests.fixtures.broker import BrokerProcess, free_port, start_broker

TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def _broker(workdir: Path, module: str) -> tuple[BrokerProcess, int]:
    http = free_port()
    args = ("--http", f"127.0.0.1:{http}", "--log-level", "WARNING", "--default-partitions", "4")
    return start_broker(workdir, extra_args=args, module=module), http


def _small_produce(spec: dict[str, Any]) -> dict[str, Any]:
    """Full speed, one 100-byte message per Produce request (``linger.ms`` 0, batches of
    one): the request-heavy worst case for per-request costs. Runs in its own process."""
    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": spec["bootstrap"], "acks": "all", "linger.ms": 0,
            "batch.num.messages": 1, "log_level": 3,
        }
    )  # fmt: skip
    p.produce(spec["topic"], b"w", partition=0)
    p.flush(30)
    errors = 0

    def done(err: Any, _msg: Any) -> None:
        nonlocal errors
        errors += err is not None

    start = time.perf_counter()
    for i in range(spec["messages"]):
        while True:
            try:
                p.produce(spec["topic"], b"x" * 100, partition=i % 4, on_delivery=done)
                break
            except BufferError:
                p.poll(0.005)
        p.poll(0)
    unsent = p.flush(120)
    return {"messages": spec["messages"], "seconds": time.perf_counter() - start,
            "errors": errors + unsent}  # fmt: skip


def _run_small(b: BrokerProcess, topic: str, messages: int) -> dict[str, Any]:
    spec = {"bootstrap": b.bootstrap, "topic": topic, "messages": messages}
    cmd = [sys.executable, "-m", "bench.obs", "small-worker", json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _produce(b: BrokerProcess, topic: str, messages: int, rate: float = 0) -> dict[str, Any]:
    spec = {
        "kind": "produce", "bootstrap": b.bootstrap, "topic": topic, "messages": messages,
        "rate": rate, "partitions": 4, "size": 1024, "idempotence": False,
    }  # fmt: skip
    return run_worker(spec)


def hook_cost_us(n: int = 50_000, repeat: int = 7) -> float:
    """µs per request of the connection hook's calls (arrived, started, deferred,
    finished with an Encoded Produce response of one partition), in this process: the
    fastest of ``repeat`` runs (the least disturbed by other processes)."""
    from broker.handlers.registry import Encoded
    from broker.handlers.routes import build_routes
    from broker.request_metrics import RequestRecorder
    from broker.telemetry import Telemetry
    from protocol.frame import RequestHeader
    from protocol.produce_fast import ProducePartitionResult, ProduceTopicResult

    conn = RequestRecorder(Telemetry(), routes=build_routes()).connection()
    hdr = RequestHeader(0, 9, 1, "bench", 20)
    resp = Encoded([b"x" * 60], [ProduceTopicResult("t", [ProducePartitionResult(0, 0)])])
    bufs = [b"x" * 60]
    loop = asyncio.new_event_loop()
    futs = [loop.create_future() for _ in range(n)]
    best = float("inf")
    for _ in range(repeat):
        futs = [loop.create_future() for _ in range(n)]
        start = time.perf_counter()
        for f in futs:
            conn.arrived(1000)
            conn.started(hdr)
            wrapped = conn.deferred(f)  # the coroutine the connection's task runs
            f.set_result(None)
            try:
                wrapped.send(None)  # type: ignore[attr-defined]
            except StopIteration:
                pass
            conn.finished(resp, bufs)
        best = min(best, time.perf_counter() - start)
    loop.close()
    return best / n * 1e6


def cost(rounds: int, messages: int, small: bool = False) -> None:
    rates: dict[str, list[float]] = {"with": [], "without": []}
    cpu_per_msg: dict[str, list[float]] = {"with": [], "without": []}
    modules = {"with": "broker.cli", "without": "bench.nometrics_broker"}
    requests: list[float] = []
    cpu_with: list[float] = []
    for r in range(rounds):
        order = ["with", "without"] if r % 2 == 0 else ["without", "with"]
        for mode in order:
            with tempfile.TemporaryDirectory() as tmp:
                b, http = _broker(Path(tmp), modules[mode])
                try:
                    _produce(b, "warm", 2000)
                    before = _produce_hist(http).get(float("inf"), 0.0)
                    cpu0 = _cpu_seconds(b.pid)
                    if small:
                        res = _run_small(b, "load", messages)
                    else:
                        res = _produce(b, "load", messages)
                    cpu = _cpu_seconds(b.pid) - cpu0
                    if mode == "with":
                        hist = _produce_hist(http)
                        requests.append(hist.get(float("inf"), 0.0) - before)
                        cpu_with.append(cpu)
                finally:
                    b.stop()
            assert res["errors"] == 0, res
            rate = res["messages"] / res["seconds"]
            rates[mode].append(rate)
            cpu_per_msg[mode].append(cpu / res["messages"] * 1e6)
            print(f"round {r + 1} {mode:>7} histograms: {rate:8.0f} msg/s, "
                  f"broker CPU {cpu_per_msg[mode][-1]:.1f} µs/msg, "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    w, wo = statistics.median(rates["with"]), statistics.median(rates["without"])
    cw, cwo = statistics.median(cpu_per_msg["with"]), statistics.median(cpu_per_msg["without"])
    print(f"median: with {w:.0f} msg/s, without {wo:.0f} msg/s: {(wo - w) / wo * 100:+.1f} % cost")
    print(f"broker CPU per message: with {cw:.1f} µs, without {cwo:.1f} µs: "
          f"{(cw - cwo) / cwo * 100:+.1f} %")  # fmt: skip
    per_request = statistics.median(
        c / max(n, 1) * 1e6 for c, n in zip(cpu_with, requests, strict=True)
    )
    hook = hook_cost_us()
    print(f"Produce requests per run: {statistics.median(requests):.0f}; broker CPU per "
          f"Produce request {per_request:.0f} µs; the hook costs {hook:.2f} µs per request "
          f"({hook / per_request * 100:.1f} % of it)")  # fmt: skip


def _produce_hist(http: int) -> dict[float, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=20) as r:
        text = r.read().decode()
    out: dict[float, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != "kafscale_request_duration_seconds":
            continue
        for s in fam.samples:
            if s.name.endswith("_bucket") and s.labels.get("api") == "Produce":
                le = float(s.labels["le"])
                out[le] = out.get(le, 0.0) + s.value
    return out


def _quantile(q: float, buckets: dict[float, float]) -> float:
    """``histogram_quantile`` over cumulative ``buckets`` (upper bound -> count)."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for b in bounds:
        if buckets[b] >= rank:
            if b == float("inf"):
                return lower
            return lower + (b - lower) * (rank - below) / max(buckets[b] - below, 1e-12)
        lower, below = b, buckets[b]
    return lower


def cpu(rates: list[int], seconds: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        b, http = _broker(Path(tmp), "broker.cli")
        try:
            _produce(b, "steps", 2000)
            print(
                "rate msg/s (got) | broker CPU % of one core | Produce p50 ms | p99 ms | "
                "client p99 ms | machine load (1 min)"
            )
            for rate in rates:
                h0, c0, t0 = _produce_hist(http), _cpu_seconds(b.pid), time.monotonic()
                res = _produce(b, "steps", int(rate * seconds), rate)
                h1, c1, t1 = _produce_hist(http), _cpu_seconds(b.pid), time.monotonic()
                delta = {le: h1[le] - h0.get(le, 0.0) for le in h1}
                util = (c1 - c0) / (t1 - t0) * 100
                p50, p99 = _quantile(0.5, delta) * 1e3, _quantile(0.99, delta) * 1e3
                got = res["messages"] / res["seconds"]
                print(f"{rate:>6} ({got:6.0f}) | {util:5.1f} | {p50:6.2f} | {p99:6.2f} | "
                      f"{res['p99_ms']:.1f} | {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
        finally:
            b.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.obs", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cost", help="per-request histogram overhead")
    c.add_argument("--rounds", type=int, default=2)
    c.add_argument("--messages", type=int, default=60_000)
    c.add_argument("--small", action="store_true", help="one 100-byte message per request")
    w = sub.add_parser("small-worker", help=argparse.SUPPRESS)
    w.add_argument("spec")
    u = sub.add_parser("cpu", help="produce latency against broker CPU")
    u.add_argument("--rates", default="1000,2000,4000,8000,12000,16000")
    u.add_argument("--seconds", type=float, default=6.0)
    args = p.parse_args(argv)
    if args.cmd == "small-worker":
        print(json.dumps(_small_produce(json.loads(args.spec))), flush=True)
    elif args.cmd == "cost":
        cost(args.rounds, args.messages, args.small)
    else:
        cpu([int(r) for r in args.rates.split(",")], args.seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
