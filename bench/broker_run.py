"""Running ``bench.broker``: the plan, the phases, and the rounds over the targets.

Every phase (``PHASES``) runs on every target in turn, ``rounds`` times, each trial a
worker process (``bench.broker_workers``); per target and phase the median trial is kept
(``run_targets``). MB means 10^6 bytes of message values.
"""

from __future__ import annotations

import contextlib
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.broker_targets import Sampler, Target, cpu_seconds, profiled, quiesce
from bench.broker_waits import scrape_buckets, waits
from bench.broker_workers import run_worker

MSG_SIZE = 1024
MB = 1_000_000


@dataclass(frozen=True, slots=True)
class Plan:
    messages: int  # per full-speed run (produce, idempotent produce, consume)
    paced_rate: int  # msg/s of the paced latency run
    paced_seconds: float
    partitions: int
    compression: str = "none"  # producers' compression.type
    # the clients' nice value: librdkafka's idempotent producer busy-polls while its one
    # request per partition is in flight (docs/benchmarks.md, "Round 26"); at 19 that
    # spin takes only CPU the broker leaves idle, as on a client host of its own
    client_nice: int = 0


QUICK = Plan(messages=60_000, paced_rate=2_000, paced_seconds=3.0, partitions=1)
FULL = Plan(messages=150_000, paced_rate=2_000, paced_seconds=5.0, partitions=1)


def create_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    """CreateTopics on the broker."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    futures = admin.create_topics([NewTopic(n, partitions, 1) for n in names])
    for fut in futures.values():
        fut.result(30)


def target_topics(target: Target, names: list[str], partitions: int) -> None:
    """Create the topics on any target: CreateTopics on a broker; the mock cluster, which
    answers no CreateTopics (and would auto-create 4 partitions), through its host
    (bench/mock_cluster.py)."""
    if target.create_mock_topic is None:
        create_topics(target.bootstrap, names, partitions)
        return
    for name in names:
        target.create_mock_topic(name, partitions)


def take_partitions(
    run: Callable[[dict[str, Any]], Any], spec: dict[str, Any], targets: list[Target]
) -> float:
    """Produce ``max(2000, 2 x partitions)`` messages of the produce ``spec`` through
    ``run`` (a worker: librdkafka's or the Java client's), unmeasured, so that the broker
    has taken every partition of the topic (one metadata transaction each), then wait
    until the targets are idle; the seconds waited. A measurement that follows is of
    produce to active partitions, not of their takeover (docs/benchmarks.md, "Round
    24")."""
    run({**spec, "messages": max(2000, 2 * int(spec["partitions"])), "rate": 0})
    return quiesce(targets)


PHASES = ("produce", "produce_idem", "paced", "paced_plain", "consume", "consume_cached")
#: the paced phases: idempotent (one request in flight per partition, docs/benchmarks.md
#: "Round 2b") and plain (requests pipelined), at the same rate
PACED = ("paced", "paced_plain")
CACHED_MESSAGES = 40_000  # at most this many for the from-cache consume (fits 64 MiB)
SETTLE_S = 3.5  # after its fill: merges of the new segments (2 s min age) are done
IDLE_S = 1.5  # then the idle broker's CPU is measured this long
CACHED_PASSES = 3


def _phase_specs(target: Target, plan: Plan, run: str) -> dict[str, dict[str, Any]]:
    topics = {k: f"bench-{k}-{run}" for k in ("produce", "idem", "paced", "plain", "cached")}
    target_topics(target, list(topics.values()), plan.partitions)
    base = {"bootstrap": target.bootstrap, "size": MSG_SIZE, "partitions": plan.partitions,
            "compression": plan.compression, "nice": plan.client_nice}  # fmt: skip
    specs: dict[str, dict[str, Any]] = {
        "produce": {"kind": "produce", "topic": topics["produce"], "messages": plan.messages,
                    "idempotence": False},
        "produce_idem": {"kind": "produce", "topic": topics["idem"], "messages": plan.messages,
                         "idempotence": True},
        "paced": {"kind": "produce", "topic": topics["paced"], "idempotence": True,
                  "messages": int(plan.paced_rate * plan.paced_seconds), "rate": plan.paced_rate},
        "paced_plain": {"kind": "produce", "topic": topics["plain"], "idempotence": False,
                        "messages": int(plan.paced_rate * plan.paced_seconds),
                        "rate": plan.paced_rate},
        "consume": {"kind": "consume", "topic": topics["produce"], "messages": plan.messages,
                    "rewind": target.name == "mock"},
        # a topic small enough for the segment cache, produced just before (untimed, in
        # the cache as it is committed): what a consumer close to the log end costs
        # read CACHED_PASSES times over (rewinding): volume enough for the CPU clock's
        # 10 ms ticks, little of it the consumer's start
        "consume_cached": {"kind": "consume", "topic": topics["cached"],
                           "messages": CACHED_PASSES * min(plan.messages // 2, CACHED_MESSAGES),
                           "fill": min(plan.messages // 2, CACHED_MESSAGES), "rewind": True},
    }  # fmt: skip
    return {k: {**base, **v} for k, v in specs.items()}


def warm_up(target: Target, plan: Plan) -> None:
    topic = f"bench-warm-{uuid.uuid4().hex[:6]}"
    target_topics(target, [topic], plan.partitions)
    base = {"bootstrap": target.bootstrap, "size": MSG_SIZE, "partitions": plan.partitions}
    run_worker({**base, "kind": "produce", "topic": topic, "messages": 2000, "idempotence": True})
    run_worker({**base, "kind": "consume", "topic": topic, "messages": 2000})


def _run_phase(target: Target, phase: str, spec: dict[str, Any], spy: Path | None) -> Any:
    idle_rate = None
    fill = spec.pop("fill", 0)
    if fill:  # produce what the phase then consumes (not measured)
        run_worker({**spec, "kind": "produce", "idempotence": False, "messages": fill})
        if target.name != "mock":
            time.sleep(SETTLE_S)  # the broker's background merges, not the consume's cost
            idle_rate = _idle_cpu_rate(target.pid)
    hist = scrape_buckets(target.metrics_url)
    cpu, start = cpu_seconds(target.pid), time.perf_counter()
    store_cpu = cpu_seconds(target.store_pid) if target.store_pid else None
    with profiled(target, phase, spy):
        res = run_worker(spec)
    res["server_cpu_s"] = cpu_seconds(target.pid) - cpu
    if store_cpu is not None:  # the S3 server's share of the same cores
        res["store_cpu_s"] = cpu_seconds(target.store_pid) - store_cpu
    if idle_rate is not None:  # what the idle broker spends meanwhile (/metrics, leases)
        res["server_idle_cpu_s"] = idle_rate * (time.perf_counter() - start)
    res.update(waits(hist, scrape_buckets(target.metrics_url)))
    res["flush_interval_ms"] = target.flush_interval_ms
    print(f"  {target.name:<6} {phase:<13} {_brief(res)}", flush=True)
    return res


def _idle_cpu_rate(pid: int | None, seconds: float = IDLE_S) -> float:
    """CPU seconds per second of the broker with no client (its background work and the
    bench's own /metrics scrapes), to set beside a short phase's CPU."""
    cpu = cpu_seconds(pid)
    time.sleep(seconds)
    return (cpu_seconds(pid) - cpu) / seconds


def _median(trials: list[dict[str, Any]], phase: str) -> dict[str, Any]:
    """The trial with the median figure: throughput; for a paced run its p99, the figure
    issue 13's latency goal is about (by p50, one stall in one of three trials had made
    the kept trial's p99 4x the others': docs/benchmarks.md, "Round 24"). Every figure
    printed for a phase is of that one trial (its budget's parts included)."""
    key = (lambda r: r["p99_ms"]) if phase in PACED else (lambda r: rate(r, True)[0])
    return sorted(trials, key=key)[len(trials) // 2]


def run_targets(
    targets: list[Target], plan: Plan, rounds: int, spy_dir: Path | None
) -> dict[str, dict[str, Any]]:
    """Every phase on every target in turn (so they share the machine's noise alike),
    ``rounds`` times; per target and phase the median trial is kept."""
    for t in targets:  # load lazily imported code (the S3 client) before the baseline
        warm_up(t, plan)
    samplers = {t.name: Sampler(t.pid, t.metrics_url).start()
                for t in targets if t.pid and t.metrics_url}  # fmt: skip
    trials: dict[str, dict[str, list[Any]]] = {t.name: {p: [] for p in PHASES} for t in targets}
    try:
        for r in range(rounds):
            print(f"== round {r + 1}/{rounds}", flush=True)
            specs = {t.name: _phase_specs(t, plan, f"{r}-{uuid.uuid4().hex[:6]}") for t in targets}
            for phase in PHASES:
                for t in targets:
                    with contextlib.ExitStack() as quiet:
                        if phase in PACED:  # latency: no target is scraped meanwhile
                            for sampler in samplers.values():
                                quiet.enter_context(sampler.quiet())
                        trials[t.name][phase].append(
                            _run_phase(t, phase, specs[t.name][phase], spy_dir)
                        )
    finally:
        for sampler in samplers.values():
            sampler.stop()
    results: dict[str, dict[str, Any]] = {}
    for t in targets:
        results[t.name] = {p: _median(trials[t.name][p], p) for p in PHASES}
        results[t.name]["trials"] = trials[t.name]
        if (sm := samplers.get(t.name)) is not None:
            results[t.name]["memory"] = {
                "baseline_rss": sm.baseline_rss,
                "max_rss": max(sm.max_rss, sm.baseline_rss),
                "hwm_rss": sm.hwm(),
                "limit_bytes": t.limit_bytes,
                "peaks": sm.peaks,
            }
    return results


def rate(res: dict[str, Any], steady: bool = False) -> tuple[float, float]:
    prefix = "steady_" if steady and res.get("steady_seconds") else ""
    secs = res[prefix + "seconds"] or math.nan
    return res[prefix + "bytes"] / secs / MB, res[prefix + "messages"] / secs


def _brief(res: dict[str, Any]) -> str:
    mbs, msgs = rate(res, steady=True)
    text = f"{mbs:8.1f} MB/s {msgs:10.0f} msg/s  ({res['messages']} msgs, {res['errors']} errors)"
    if res.get("server_cpu_s") and res["bytes"]:
        text += f"  server CPU {res['server_cpu_s'] * 1000 / (res['bytes'] / MB):.1f} ms/MB"
    if "put_p99_ms" in res:
        text += f"  PUT p99 {res['put_p99_ms']:.1f} ms ({res['put_count']})"
        text += f" max {res.get('put_max_ms', float('nan')):.0f}"
    if "commit_p99_ms" in res:
        text += f"  txn p99 {res['commit_p99_ms']:.1f} ms ({res['commit_count']})"
        text += f" max {res.get('commit_max_ms', float('nan')):.0f}"
    if "wait_p99_ms" in res:
        text += f"  cycle wait p99 {res['wait_p99_ms']:.1f} ms"
    if "p50_ms" in res:
        text += f"  p50 {res['p50_ms']:.1f} ms  p99 {res['p99_ms']:.1f} ms"
    if "broker_p99_ms" in res:  # the broker's own Produce p99 (bench/broker_waits.py)
        text += f"  broker p99 {res['broker_p99_ms']:.1f} ms ({res['broker_count']})"
        text += f" per byte {res.get('bytes_p99_ms', float('nan')):.1f} ms"
        text += f"  merged {res.get('merged', '-')}"
    return text
