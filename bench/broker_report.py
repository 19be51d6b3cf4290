"""The report of ``bench.broker``: one table of every target's figures and the ratios
broker/mock, then a line per broker on its memory against its configured limits."""

from __future__ import annotations

import math
from typing import Any

from bench.broker_run import MSG_SIZE, Plan, rate
from bench.broker_targets import LEASE_GAP, MIB, TARGETS

#: how far a broker's RSS may grow beyond its configured buffers (issue 13, "Memory")
RSS_SLACK_MIB = 100

ROWS: list[tuple[str, str, str]] = [
    # label, phase, metric
    ("server CPU ms/MB, produce", "produce", "cpu"),
    ("server CPU ms/MB, idempotent", "produce_idem", "cpu"),
    ("server CPU ms/MB, consume", "consume", "cpu"),
    ("server CPU ms/MB, consume from cache", "consume_cached", "cpu"),
    ("  the same, net of the idle broker's", "consume_cached", "cpu_net"),
    ("S3 server CPU ms/MB, produce", "produce", "store_cpu"),
    ("S3 server CPU ms/MB, idempotent", "produce_idem", "store_cpu"),
    # the client shares the machine's cores: what every process of a phase spent per MB,
    # and the cores they kept busy, bound its throughput (docs/benchmarks.md, "Round 25")
    ("client CPU ms/MB, produce", "produce", "client_cpu"),
    ("client CPU ms/MB, idempotent", "produce_idem", "client_cpu"),
    ("all processes' CPU ms/MB, produce", "produce", "all_cpu"),
    ("all processes' CPU ms/MB, idempotent", "produce_idem", "all_cpu"),
    ("cores busy, produce", "produce", "cores"),
    ("cores busy, idempotent", "produce_idem", "cores"),
    ("produce MB/s (acks=all)", "produce", "mbs"),
    ("produce msg/s", "produce", "msgs"),
    ("produce p50 ms (saturated)", "produce", "p50_ms"),
    ("produce p99 ms (saturated)", "produce", "p99_ms"),
    ("idempotent produce MB/s", "produce_idem", "mbs"),
    ("idempotent produce msg/s", "produce_idem", "msgs"),
    ("idempotent p50 ms (saturated)", "produce_idem", "p50_ms"),
    ("idempotent p99 ms (saturated)", "produce_idem", "p99_ms"),
    # one request in flight per partition (librdkafka): the round trip sets the rate
    # (docs/benchmarks.md, "Round 27"); the client's time between requests, then the
    # broker's means (histogram sums: exact) of the request and its cycle's parts
    ("  idempotent: ms between requests", "produce_idem", "request_interval"),
    ("  idempotent: broker Produce mean ms", "produce_idem", "broker_mean_ms"),
    ("  idempotent: segment PUT mean ms", "produce_idem", "put_mean_ms"),
    ("  idempotent: metadata txn mean ms", "produce_idem", "commit_mean_ms"),
    ("paced p50 ms", "paced", "p50_ms"),
    ("paced p99 ms", "paced", "p99_ms"),
    ("  paced: segment PUT p99 ms", "paced", "put_p99_ms"),
    ("  paced: metadata txn p99 ms", "paced", "commit_p99_ms"),
    ("  paced: interval+PUT+txn p99 ms", "paced", "budget"),
    ("  paced: wait for a cycle p99 ms", "paced", "wait_p99_ms"),
    # docs/benchmarks.md, "Round 4: paced p99": the broker's share of the paced p99 (its
    # Produce requests, read -> response written) and what lies inside it
    ("  paced: broker Produce p99 ms", "paced", "broker_p99_ms"),
    ("  paced: the same per byte (~per msg)", "paced", "bytes_p99_ms"),
    ("  paced: broker commit wait p99 ms", "paced", "acked_p99_ms"),
    ("  paced: cycle's wait for prior commit p99", "paced", "order_p99_ms"),
    ("  paced: flush timer lag p99 ms", "paced", "lag_p99_ms"),
    ("  paced: segments merged meanwhile", "paced", "merged"),
    ("paced plain (non-idem.) p50 ms", "paced_plain", "p50_ms"),
    ("paced plain (non-idem.) p99 ms", "paced_plain", "p99_ms"),
    ("  plain: interval+PUT+txn p99 ms", "paced_plain", "budget"),
    ("  plain: broker Produce p99 ms", "paced_plain", "broker_p99_ms"),
    ("  plain: the same per byte (~per msg)", "paced_plain", "bytes_p99_ms"),
    ("  plain: broker commit wait p99 ms", "paced_plain", "acked_p99_ms"),
    ("  plain: wait for a cycle p99 ms", "paced_plain", "wait_p99_ms"),
    ("  plain: cycle's wait for prior commit p99", "paced_plain", "order_p99_ms"),
    ("  plain: flush timer lag p99 ms", "paced_plain", "lag_p99_ms"),
    ("  plain: segments merged meanwhile", "paced_plain", "merged"),
    ("consume MB/s", "consume", "mbs"),
    ("consume msg/s", "consume", "msgs"),
    ("consume from cache MB/s", "consume_cached", "mbs"),
]


def figure(results: dict[str, Any], phase: str, metric: str) -> float:
    """One target's ``metric`` of ``phase`` (NaN where the run did not take it)."""
    res = results.get(phase)
    if res is None:
        return math.nan
    if metric == "store_cpu":  # the S3 server's (SeaweedFS), same phase
        mb = res["bytes"] / 1e6
        return res["store_cpu_s"] * 1000 / mb if "store_cpu_s" in res and mb else math.nan
    if metric in ("client_cpu", "all_cpu", "cores"):
        return _client_cpu(res, metric)
    if metric in ("cpu", "cpu_net"):
        mb = res["bytes"] / 1e6
        idle = res.get("server_idle_cpu_s", 0.0) if metric == "cpu_net" else 0.0
        if metric == "cpu_net" and "server_idle_cpu_s" not in res:
            return math.nan
        return (
            (res["server_cpu_s"] - idle) * 1000 / mb if res.get("server_cpu_s") and mb else math.nan
        )
    if metric == "budget":  # the paced p99 goal of issue 13
        parts = [res.get("flush_interval_ms"), res.get("put_p99_ms"), res.get("commit_p99_ms")]
        return math.nan if None in parts else float(sum(parts))
    if metric == "request_interval":  # the phase's time per Produce request
        n = res.get("broker_count")
        return res["seconds"] * 1000 / n if n and res.get("seconds") else math.nan
    if metric in ("mbs", "msgs"):
        mbs, msgs = rate(res, steady=phase.startswith("consume"))
        return mbs if metric == "mbs" else msgs
    return float(res.get(metric, math.nan))


def _client_cpu(res: dict[str, Any], metric: str) -> float:
    """The client's CPU per MB; with the server's and the S3 server's (``all_cpu``); or
    all three's CPU seconds per second of the phase (``cores``)."""
    mb, client = res["bytes"] / 1e6, res.get("cpu_seconds")
    if client is None or not mb or not res.get("seconds"):
        return math.nan
    if metric == "client_cpu":
        return client * 1000 / mb
    total = client + res.get("server_cpu_s", 0.0) + res.get("store_cpu_s", 0.0)
    return total * 1000 / mb if metric == "all_cpu" else total / res["seconds"]


def _fmt(v: float) -> str:
    if math.isnan(v):
        return "-"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.2f}" if abs(v) < 10 else f"{v:.1f}"


def format_table(all_results: dict[str, dict[str, Any]], plan: Plan) -> str:
    names = [t for t in TARGETS if t in all_results]
    brokers = [t for t in names if t != "mock"]
    ratios = [f"{t}/mock" for t in brokers] if "mock" in names else []
    head = ["metric", *names, *ratios]
    rows = [head]
    for label, phase, metric in ROWS:
        vals = [figure(all_results[t], phase, metric) for t in names]
        row = [label, *(_fmt(v) for v in vals)]
        if ratios:
            mock = figure(all_results["mock"], phase, metric)
            row += [_fmt(figure(all_results[t], phase, metric) / mock) if mock else "-"
                    for t in brokers]  # fmt: skip
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [
        f"{plan.messages} x {MSG_SIZE} B values per full-speed run, {plan.partitions} "
        f"partition(s), paced run {plan.paced_rate} msg/s for {plan.paced_seconds:g} s; "
        "MB = 10^6 B" + (f"; clients at nice {plan.client_nice}" if plan.client_nice else "")
    ]
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(widths[j]) if j == 0 else c.rjust(widths[j])
                               for j, c in enumerate(r)))  # fmt: skip
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    for t in brokers:
        lines.append(_memory_line(t, all_results[t].get("memory")))
    return "\n".join(lines)


def rss_growth(mem: dict[str, Any]) -> tuple[float, float]:
    """A broker's RSS growth over the run and its configured buffers, both in MiB."""
    return (mem["max_rss"] - mem["baseline_rss"]) / MIB, mem["limit_bytes"] / MIB


def _memory_line(name: str, mem: dict[str, Any] | None) -> str:
    if not mem:
        return f"{name}: no memory samples"
    m = {k: v / MIB for k, v in mem.items() if isinstance(v, int | float)}
    peaks = ", ".join(f"{k.removeprefix('kafscale_')} {v / MIB:.1f}"
                      for k, v in sorted(mem["peaks"].items()) if k != LEASE_GAP)  # fmt: skip
    gap = mem["peaks"].get(LEASE_GAP)
    growth, limit = rss_growth(mem)
    verdict = "within" if growth <= limit else "OVER"
    goal = "within" if growth <= limit + RSS_SLACK_MIB else "OVER"
    return (
        f"{name} broker RSS MiB: baseline {m['baseline_rss']:.0f}, max sampled "
        f"{m['max_rss']:.0f}, peak (VmHWM) {m['hwm_rss']:.0f}; growth {growth:.0f} {verdict} "
        f"limits {m['limit_bytes']:.0f} (in-flight + cache), {goal} limits + {RSS_SLACK_MIB}; "
        f"gauge peaks MiB: {peaks}"
        + (f"; worst lease keep-alive gap {gap:.2f} s" if gap is not None else "")
    )
