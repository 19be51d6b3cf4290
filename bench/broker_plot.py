"""The PNG of docs/benchmarks.md: produce throughput and p99 against offered load, one line
per target (``python -m bench.broker --sweep RATES --plot PATH``). Needs matplotlib (the
``bench`` extra); without it the sweep is printed and one line says what to install."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def plot(sweep: dict[str, list[dict[str, Any]]], path: Path, title: str) -> bool:
    """Draw ``sweep`` into ``path``; False (and one line on stderr) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:
        print("plot skipped: matplotlib is not installed; pip install 'kafscale[bench]'",
              file=sys.stderr)  # fmt: skip
        return False
    fig, (ax_t, ax_l) = plt.subplots(1, 2, figsize=(11, 4.2))
    full = max((p["mbs"] for pts in sweep.values() for p in pts), default=1.0)
    for name, points in sweep.items():
        # full speed is drawn at the highest offered load of the sweep + 25 %, marked
        xs = [p["offered_mbs"] or 0.0 for p in points]
        top = max(xs + [full]) * 1.25
        xs = [x or top for x in xs]
        (line,) = ax_t.plot(xs, [p["mbs"] for p in points], marker="o", label=name)
        ax_l.plot(xs, [p["p99_ms"] for p in points], marker="o", color=line.get_color(),
                  label=name)  # fmt: skip
    for ax in (ax_t, ax_l):
        ax.set_xscale("log")
        ax.set_xlabel("offered load, MB/s (rightmost point: full speed)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    ax_t.set_ylabel("achieved MB/s")
    ax_t.set_yscale("log")
    ax_l.set_ylabel("p99 delivery latency, ms")
    ax_l.set_yscale("log")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
