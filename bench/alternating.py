"""Trials of this tree and of another (``--base-tree``) alternating, a fresh work
directory each, the order swapped every round; then the medians and the ratios of the
chosen keys (this tree / base). Shared by ``bench.paced_tail`` and ``bench.scrape_stall``."""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.fs_probe import bench_dir

Trial = Callable[[Path | None, Path], dict[str, float]]


def alternate(
    trial: Trial,
    base_tree: Path | None,
    rounds: int,
    fmt: Callable[[dict[str, float]], str],
    ratio_keys: Sequence[str],
    prefix: str,
) -> dict[str, dict[str, float]]:
    """Run ``trial(tree, workdir)`` ``rounds`` times per tree (None: this tree), print
    each result with ``fmt``, then the medians and the ratios; returns the medians."""
    trees: list[tuple[str, Path | None]] = [("this tree", None)]
    if base_tree is not None:
        trees.append(("base", base_tree.resolve()))
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    for rnd in range(rounds):
        for name, tree in trees if rnd % 2 == 0 else trees[::-1]:
            with tempfile.TemporaryDirectory(prefix=prefix, dir=bench_dir()) as wd:
                r = trial(tree, Path(wd))
            results[name].append(r)
            print(f"round {rnd + 1}, {name}: {fmt(r)}", flush=True)
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
           for name, rs in results.items()}  # fmt: skip
    for name, m in med.items():
        print(f"median, {name}: {fmt(m)}")
    if "base" in med:
        ours, base = med["this tree"], med["base"]
        ratios = ", ".join(f"{k} {ours[k] / base[k]:.2f}" for k in ratio_keys if base[k])
        print(f"ratio this tree / base: {ratios}")
    return med
