"""What a flush cycle waits on, read off the broker's ``/metrics`` around a bench phase:
the p99 of its segment PUTs and of its metadata transactions (fine-bucketed histograms,
``broker/log_metrics.py``), so the paced p99 can be set against
``flush interval + PUT p99 + metadata-transaction p99`` measured in the same run (issue 13).
Beside them (docs/benchmarks.md, "Round 4: paced p99"): the broker's own Produce latency
(request read -> response written) and its wait on the flush and commit
(``broker/request_metrics.py``), a cycle's wait for the previous cycle's commit, and how
late the flush timer ran (the event loop's lag).
"""

from __future__ import annotations

import math
import urllib.request
from typing import Any

PUT = "kafscale_segment_put_duration_seconds"
COMMIT = "kafscale_flush_commit_duration_seconds"
WAIT = "kafscale_flush_wait_seconds"  # a batch's wait for its cycle to start
PRODUCE = "kafscale_produce_request_duration_seconds"  # request read -> response written
PRODUCE_WAIT = "kafscale_produce_commit_wait_seconds"  # its wait on the flush and commit
PER_BYTE = "kafscale_produce_byte_duration_seconds"  # the same per byte: ~ per message
ORDER = "kafscale_flush_order_wait_seconds"  # a cycle's wait for the previous commit
TIMER = "kafscale_flush_timer_delay_seconds"  # the flush timer's lateness: loop lag
CYCLE = "kafscale_flush_cycle_duration_seconds"  # a whole cycle: its PUTs and its commit
#: histogram -> the result key's prefix
KEYS = {PUT: "put", COMMIT: "commit", WAIT: "wait", PRODUCE: "broker", PRODUCE_WAIT: "acked",
        PER_BYTE: "bytes", ORDER: "order", TIMER: "lag", CYCLE: "cycle"}  # fmt: skip
#: counters whose growth during the phase is reported (result key): segments merged by
#: the broker's maintenance meanwhile (a burst's merges share the disk and the cores)
COUNTERS = {"kafscale_maintenance_merged_segments_total": "merged"}
Buckets = dict[float, float]  # upper bound (s) -> cumulative count


def scrape_buckets(url: str | None) -> dict[str, Buckets]:
    """The cumulative bucket counts of the histograms in ``KEYS``, their sums (as
    ``NAME_sum``: {inf: seconds}) and the ``COUNTERS`` ({} when absent)."""
    if not url:
        return {}
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, Buckets] = {}
    for line in text.splitlines():
        counter, _, value = line.partition(" ")
        if counter in COUNTERS or counter.removesuffix("_sum") in KEYS:
            out[counter] = {math.inf: float(value)}
            continue
        name, _, rest = line.partition("_bucket{")
        if name not in KEYS:
            continue
        labels, _, value = rest.partition("} ")
        le = labels.split('le="', 1)[1].split('"', 1)[0]
        out.setdefault(name, {})[math.inf if le == "+Inf" else float(le)] = float(value)
    return out


def quantile(before: Buckets, after: Buckets, q: float) -> tuple[float, int]:
    """(the ``q`` quantile in ms, linearly interpolated inside its bucket as Prometheus'
    histogram_quantile does; the number of observations) of what happened in between."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return math.nan, 0
    rank = q * total
    lo, prev = 0.0, 0.0
    for bound, cum in zip(bounds, counts, strict=True):
        if cum >= rank:
            if math.isinf(bound):
                return lo * 1000, int(total)  # past the last finite bound: report that
            inside = (rank - prev) / (cum - prev) if cum > prev else 1.0
            return (lo + (bound - lo) * inside) * 1000, int(total)
        lo, prev = bound, cum
    return lo * 1000, int(total)


def waits(before: dict[str, Buckets], after: dict[str, Buckets]) -> dict[str, Any]:
    """``put_p99_ms``, ``commit_p99_ms``, ``wait_p99_ms`` (and ``broker_``, ``acked_``,
    ``bytes_``, ``order_``, ``lag_``), their counts, their ``_max_ms`` (the highest
    bucket's bound) and their ``_mean_ms`` (from the histograms' sums: exact, where a
    quantile is interpolated in its bucket) for one phase (only those the broker
    exports: a base tree from before they existed has fewer or none)."""
    out: dict[str, Any] = {}
    for name, key in KEYS.items():
        if name in after:
            p99, n = quantile(before.get(name, {}), after[name], 0.99)
            out[f"{key}_p99_ms"], out[f"{key}_count"] = p99, n
            # the top of the highest bucket reached: a stall of one or two cycles in a
            # paced phase lies above the p99 of its ~500 PUTs and commits
            out[f"{key}_max_ms"] = quantile(before.get(name, {}), after[name], 1.0)[0]
            total = _grown(before, after, f"{name}_sum")
            if total is not None and n:
                out[f"{key}_mean_ms"] = total * 1000 / n
    for name, key in COUNTERS.items():
        grown = _grown(before, after, name)
        if grown is not None:
            out[key] = int(grown)
    return out


def _grown(before: dict[str, Buckets], after: dict[str, Buckets], name: str) -> float | None:
    """How much a single-valued series (a counter, a histogram's sum) grew; None: absent."""
    if name not in after:
        return None
    return after[name][math.inf] - before.get(name, {}).get(math.inf, 0.0)
