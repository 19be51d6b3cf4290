"""The one percentile every bench reports: nearest rank over sorted values."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of sorted values (NaN for none)."""
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
