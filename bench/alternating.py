"""Trials of this tree and of another (``--base-tree``) alternating, a fresh work
directory each, the order swapped every round; then the medians and the ratios of the
chosen keys (this tree / base). Shared by ``bench.paced_tail`` and ``bench.scrape_stall``.
``in_tree`` runs a bench's in-process measurement in a fresh interpreter that imports the
project from another tree (``bench.maintenance_pass``, ``bench.meta_snapshot``)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

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


REPO = Path(__file__).resolve().parents[1]


def in_tree(tree: Path, bench_file: str, call: str) -> dict[str, Any]:
    """Load ``bench_file`` by its path in a fresh interpreter whose imports come from
    ``tree`` first (then this tree, for the benches' own helpers), evaluate ``call`` in
    it (``bench_file``'s module is ``m``) and return the JSON of its last line of output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(REPO)])}
    code = (
        "import importlib.util as u; "
        f"s = u.spec_from_file_location('bench_child', {bench_file!r}); "
        f"m = u.module_from_spec(s); s.loader.exec_module(m); {call}"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tree, capture_output=True, text=True,
        timeout=1800, check=True,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result
