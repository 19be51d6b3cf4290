"""Issue 13's goals judged from one run of ``bench.broker``: each goal's figure beside
its counterpart from the same run (the mock's, the local store's, the paced budget, the
configured buffers) and whether it is met. A goal whose figures the run did not take (a
target or a phase left out) is not printed. Each goal's label states it; a run judged
this way: docs/benchmarks.md, "Round 28"."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bench.broker_report import RSS_SLACK_MIB, figure, rss_growth


@dataclass(frozen=True, slots=True)
class Goal:
    """``target``'s ``metric`` of ``phase`` judged by ``kind``: ``max`` (at most
    ``limit``), ``ratio`` (at least ``limit`` times ``against``'s same figure) or
    ``within`` (at most the same target's ``against`` metric of the phase)."""

    label: str
    target: str
    phase: str
    metric: str
    kind: str
    limit: float = math.nan
    against: str = ""


# fmt: off
GOALS: tuple[Goal, ...] = (
    Goal("plain produce: server CPU ms/MB <= 3", "local", "produce", "cpu", "max", 3.0),
    Goal("idempotent produce: server CPU ms/MB <= 3.5", "local", "produce_idem", "cpu",
         "max", 3.5),
    Goal("consume from cache: server CPU ms/MB <= 1", "local", "consume_cached", "cpu",
         "max", 1.0),
    Goal("consume from cache: server CPU ms/MB <= 1", "s3", "consume_cached", "cpu",
         "max", 1.0),
    Goal("plain produce MB/s >= 0.6 x the mock's", "local", "produce", "mbs", "ratio", 0.6,
         "mock"),
    Goal("idempotent produce MB/s >= 0.6 x the mock's", "local", "produce_idem", "mbs",
         "ratio", 0.6, "mock"),
    Goal("plain produce MB/s >= 0.7 x the local store's", "s3", "produce", "mbs", "ratio",
         0.7, "local"),
    Goal("idempotent produce MB/s >= 0.7 x the local store's", "s3", "produce_idem", "mbs",
         "ratio", 0.7, "local"),
    # the client's p99 (librdkafka counts from produce(), its linger.ms 5 included)
    Goal("paced p99 ms <= flush interval + PUT p99 + txn p99", "s3", "paced", "p99_ms",
         "within", against="budget"),
    Goal("paced p99 ms <= flush interval + PUT p99 + txn p99", "local", "paced", "p99_ms",
         "within", against="budget"),
    Goal(f"RSS growth MiB <= buffers + {RSS_SLACK_MIB}", "local", "memory", "rss", "within"),
    Goal(f"RSS growth MiB <= buffers + {RSS_SLACK_MIB}", "s3", "memory", "rss", "within"),
)
# fmt: on


def judge(goal: Goal, results: dict[str, dict[str, Any]]) -> tuple[float, float, bool] | None:
    """(figure, counterpart, met), or None when this run lacks either figure."""
    if goal.target not in results:
        return None
    if goal.phase == "memory":
        mem = results[goal.target].get("memory")
        if not mem:
            return None
        growth, limit = rss_growth(mem)
        return growth, limit + RSS_SLACK_MIB, growth <= limit + RSS_SLACK_MIB
    value = figure(results[goal.target], goal.phase, goal.metric)
    if goal.kind == "max":
        other = goal.limit
    elif goal.kind == "ratio":
        if goal.against not in results:
            return None
        other = figure(results[goal.against], goal.phase, goal.metric)
    else:
        other = figure(results[goal.target], goal.phase, goal.against)
    if math.isnan(value) or math.isnan(other):
        return None
    if goal.kind == "ratio":
        return value, other, other > 0 and value / other >= goal.limit
    return value, other, value <= other


def format_goals(results: dict[str, dict[str, Any]]) -> str:
    """One line per goal this run can judge: target, goal, figure, counterpart, verdict."""
    rows: list[list[str]] = []
    for goal in GOALS:
        judged = judge(goal, results)
        if judged is None:
            continue
        value, other, met = judged
        if goal.kind == "ratio":
            shown = f"{value:.1f} / {other:.1f} ({goal.against}) = {value / other:.3f}"
        elif goal.kind == "max":
            shown = f"{value:.2f}"
        else:
            shown = f"{value:.2f} / {other:.2f}"
        rows.append([goal.target, goal.label, shown, "met" if met else "NOT met"])
    if not rows:
        return "issue 13's goals: this run takes none of their figures"
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["issue 13's goals, judged from this run's figures:"]
    lines += [
        "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    return "\n".join(lines)


#: "flat within 20 %" (issue 13, "Many partitions"): the lowest throughput at least this
#: share of the highest, the highest p99 at most 1 / this times the lowest
FLAT_WITHIN = 0.8


def format_flatness(sweep: dict[str, list[dict[str, Any]]]) -> str:
    """Per target of a partition sweep, MB/s and p99 at each partition count and whether
    each stays flat within 20 % across the counts (lowest over highest). The mock is the
    counterpart, not judged: with it in the sweep, each broker's MB/s is also shown as a
    share of the mock's at each count (what the client alone allows there)."""
    lines = ["issue 13's many-partition goal (flat within 20 %), judged from this sweep:"]
    mock = next((points for name, points in sweep.items() if name.startswith("mock")), None)
    for name, points in sweep.items():
        if len(points) < 2:
            continue
        counts = "/".join(str(p["partitions"]) for p in points)
        for key, label, unit in (("mbs", "MB/s", ""), ("p99_ms", "p99", " ms")):
            vals = [float(p[key]) for p in points]
            low, high = min(vals), max(vals)
            share = low / high if high > 0 else math.nan
            verdict = (
                "counterpart" if points is mock else "met" if share >= FLAT_WITHIN else "NOT met"
            )
            shown = "/".join(f"{v:.1f}" for v in vals)
            lines.append(
                f"  {name:<7} {label} at {counts} partitions: {shown}{unit}; lowest / highest"
                f" = {share:.2f}  {verdict}"
            )
        if mock is not None and points is not mock and len(mock) == len(points):
            shares = "/".join(
                f"{p['mbs'] / m['mbs']:.2f}" if m["mbs"] else "-"
                for p, m in zip(points, mock, strict=True)
            )
            lines.append(f"  {name:<7} MB/s / the mock's at {counts} partitions: {shares}")
    if len(lines) == 1:
        return "issue 13's many-partition goal: the sweep needs two partition counts or more"
    return "\n".join(lines)
