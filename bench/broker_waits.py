"""What a flush cycle waits on, read off the broker's ``/metrics`` around a bench phase:
the p99 of its segment PUTs and of its metadata transactions (fine-bucketed histograms,
``broker/log_metrics.py``), so the paced p99 can be set against
``flush interval + PUT p99 + metadata-transaction p99`` measured in the same run (issue 13).
"""

from __future__ import annotations

import math
import urllib.request
from typing import Any

PUT = "kafscale_segment_put_duration_seconds"
COMMIT = "kafscale_flush_commit_duration_seconds"
WAIT = "kafscale_flush_wait_seconds"  # a batch's wait for its cycle to start
Buckets = dict[float, float]  # upper bound (s) -> cumulative count


def scrape_buckets(url: str | None) -> dict[str, Buckets]:
    """The cumulative bucket counts of the PUT and commit histograms ({} when absent)."""
    if not url:
        return {}
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, Buckets] = {}
    for line in text.splitlines():
        name, _, rest = line.partition("_bucket{")
        if name not in (PUT, COMMIT, WAIT):
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
    """``put_p99_ms``, ``commit_p99_ms``, ``wait_p99_ms`` and their counts for one phase
    (empty if the broker exports none, e.g. a base tree from before they existed)."""
    out: dict[str, Any] = {}
    for name, key in ((PUT, "put"), (COMMIT, "commit"), (WAIT, "wait")):
        if name in after:
            p99, n = quantile(before.get(name, {}), after[name], 0.99)
            out[f"{key}_p99_ms"], out[f"{key}_count"] = p99, n
    return out
