"""``python -m bench.broker --sweep RATES``: produce throughput and p99 against offered load.

For every target (interleaved, as in the main run) and every offered rate (msg/s of 1 KiB
values; 0 = as fast as the client can), one producer process (acks=all, idempotence as
the Java client's default) sends ``rate x seconds`` messages paced at that rate and
reports the rate it achieved and its delivery-report latency p50/p99, plus the server's
CPU per MB. ``bench.broker_plot`` draws the result (docs/benchmarks.md).
"""

from __future__ import annotations

import math
import uuid
from typing import Any

from bench.broker_run import MSG_SIZE, Plan, rate, take_partitions, target_topics
from bench.broker_targets import Target, cpu_seconds
from bench.broker_waits import scrape_buckets, waits
from bench.broker_workers import run_worker

FULL_SPEED_MESSAGES = 60_000


def run_sweep(
    targets: list[Target], plan: Plan, rates: list[int], seconds: float
) -> dict[str, list[dict[str, Any]]]:
    """Per target, one point per offered rate: offered and achieved MB/s, p50/p99 ms."""
    out: dict[str, list[dict[str, Any]]] = {t.name: [] for t in targets}
    for r in rates:
        for t in targets:
            topic = f"sweep-{r}-{uuid.uuid4().hex[:6]}"
            target_topics(t, [topic], plan.partitions)
            n = int(r * seconds) if r else FULL_SPEED_MESSAGES
            spec = {"bootstrap": t.bootstrap, "size": MSG_SIZE, "partitions": plan.partitions,
                    "kind": "produce", "topic": topic, "messages": n, "idempotence": True,
                    "rate": r}  # fmt: skip
            cpu = cpu_seconds(t.pid)
            res = run_worker(spec)
            cpu = cpu_seconds(t.pid) - cpu
            mbs, msgs = rate(res)
            point = {
                "offered_msgs": r or None,
                "offered_mbs": r * MSG_SIZE / 1e6 if r else None,
                "mbs": mbs,
                "msgs": msgs,
                "p50_ms": res["p50_ms"],
                "p99_ms": res["p99_ms"],
                "errors": res["errors"],
                "server_cpu_ms_per_mb": cpu * 1000 / (res["bytes"] / 1e6) if res["bytes"] else None,
            }
            out[t.name].append(point)
            offered = f"{r:>7} msg/s" if r else "full speed"
            lat = f"p50 {res['p50_ms']:8.1f} ms  p99 {res['p99_ms']:8.1f} ms"
            print(f"  sweep {t.name:<7} {offered:>13}: {mbs:7.1f} MB/s  {lat}"
                  f"  ({res['errors']} errors)", flush=True)  # fmt: skip
    return out


def format_sweep(sweep: dict[str, list[dict[str, Any]]]) -> str:
    lines = ["offered load sweep (idempotent, acks=all, 1 KiB): achieved MB/s / p99 ms"]
    names = list(sweep)
    lines.append("offered msg/s  " + "  ".join(f"{n:>20}" for n in names))
    for i, point in enumerate(sweep[names[0]]):
        offered = str(point["offered_msgs"] or "full speed")
        cells = [f"{sweep[n][i]['mbs']:8.1f} / {sweep[n][i]['p99_ms']:9.1f}" for n in names]
        lines.append(f"{offered:>13}  " + "  ".join(f"{c:>20}" for c in cells))
    return "\n".join(lines)


COUNTERS = (
    "kafscale_flush_cycles_total", "kafscale_txns_total", "kafscale_segments_total",
    "kafscale_shared_objects_total", "kafscale_shared_segments_total",
    "kafscale_cycle_txns_total", "kafscale_fold_txns_total",
)  # fmt: skip


def _counters(url: str | None) -> dict[str, float]:
    import urllib.request

    if url is None:
        return {}
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in COUNTERS:
            out[name] = float(value)
    return out


def _cycle_figures(point: dict[str, Any]) -> str:
    """A broker's flush-cycle figures of a partition-sweep point (from its /metrics)."""
    return (
        f"  txns/cycle {point['txns_per_cycle']:.2f}"
        f" (+{point['fold_txns_per_cycle']:.2f} folding)"
        f"  segs/cycle {point['segments_per_cycle']:.1f}"
        f"  objects/cycle {point['objects_per_cycle']:.1f}"
        f"  PUT p99 {point.get('put_p99_ms', math.nan):6.1f}"
        f"  commit p99 {point.get('commit_p99_ms', math.nan):6.1f}"
        f"  Produce p99 {point.get('broker_p99_ms', math.nan):6.1f} ms"
    )


def run_partition_sweep(
    targets: list[Target], counts: list[int], messages: int, client: str = "librdkafka"
) -> dict[str, list[dict[str, Any]]]:
    """Per target (the mock too, as the counterpart), full-speed idempotent produce of
    ``messages`` spread over N partitions by ``client`` (librdkafka: one partition per
    request; ``java``: every ready partition in one request, bench/java_client.py): MB/s,
    p99, server CPU per MB, metadata transactions and segments per flush cycle, and the
    broker's PUT, commit and Produce p99s. Each point first produces 2 messages per
    partition (at least 2,000), unmeasured, so that the broker has taken the partitions:
    the sweep measures produce to N active partitions, not their takeover."""
    if client == "java":
        from bench.java_client import run_java as run
    else:
        run = run_worker
    out: dict[str, list[dict[str, Any]]] = {t.name: [] for t in targets}
    for n in counts:
        for t in targets:
            topic = f"parts-{n}-{uuid.uuid4().hex[:6]}"
            target_topics(t, [topic], n)
            spec = {"bootstrap": t.bootstrap, "size": MSG_SIZE, "partitions": n,
                    "kind": "produce", "topic": topic, "messages": messages,
                    "idempotence": True}  # fmt: skip
            idle_s = take_partitions(run, spec, targets)  # and every target idle
            hist = scrape_buckets(t.metrics_url)
            before, cpu = _counters(t.metrics_url), cpu_seconds(t.pid)
            res = run(spec)
            cpu, after = cpu_seconds(t.pid) - cpu, _counters(t.metrics_url)
            d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in COUNTERS}
            cycles = d["kafscale_flush_cycles_total"] or float("nan")
            mbs, _ = rate(res)
            point = {
                "partitions": n, "client": client, "mbs": mbs, "p50_ms": res["p50_ms"],
                "quiesce_s": idle_s,
                "p99_ms": res["p99_ms"], "errors": res["errors"],
                "server_cpu_ms_per_mb": cpu * 1000 / (res["bytes"] / 1e6) if res["bytes"] else None,
                "flush_cycles": d["kafscale_flush_cycles_total"],
                "txns_per_cycle": d["kafscale_txns_total"] / cycles,
                # cycle keys (docs/architecture.md): their folds, off the acknowledgement
                # path, per cycle and per second of the run
                "fold_txns_per_cycle": d["kafscale_fold_txns_total"] / cycles,
                "fold_txns_per_s": d["kafscale_fold_txns_total"] / max(res["seconds"], 1e-9),
                "segments_per_cycle": d["kafscale_segments_total"] / cycles,
                "objects_per_cycle": (
                    d["kafscale_segments_total"] - d["kafscale_shared_segments_total"]
                    + d["kafscale_shared_objects_total"]
                ) / cycles,
                **waits(hist, scrape_buckets(t.metrics_url)),
            }  # fmt: skip
            out[t.name].append(point)
            broker = _cycle_figures(point) if t.metrics_url else ""  # the mock has none
            print(f"  partitions {t.name:<7} {n:>5}: {mbs:7.1f} MB/s  p99 {res['p99_ms']:8.1f} ms"
                  f"  CPU {point['server_cpu_ms_per_mb'] or 0:5.1f} ms/MB{broker}  ({client},"
                  f" {res['errors']} errors, {idle_s:.1f} s to quiesce)", flush=True)  # fmt: skip
    return out
