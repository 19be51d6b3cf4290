"""bench.alternating.alternate: trials of both trees alternate (the order swapped every
round), each in a fresh work directory, and the medians and ratios come out of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.alternating import alternate


def test_trials_alternate_and_the_medians_and_ratios_follow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[tuple[Path | None, Path]] = []
    values = iter([1.0, 10.0, 30.0, 3.0, 2.0, 20.0])  # ours, base, base, ours, ours, base

    def trial(tree: Path | None, workdir: Path) -> dict[str, float]:
        assert workdir.is_dir() and not any(workdir.iterdir())  # fresh, empty
        calls.append((tree, workdir))
        return {"x": next(values)}

    med = alternate(trial, tmp_path, 3, lambda r: f"x={r['x']}", ["x"], "t-")
    assert [tree for tree, _ in calls] == [None, tmp_path, tmp_path, None, None, tmp_path]
    assert med == {"this tree": {"x": 2.0}, "base": {"x": 20.0}}
    out = capsys.readouterr().out
    assert "ratio this tree / base: x 0.10" in out
    assert out.count("round ") == 6


def test_without_a_base_tree_only_this_tree_runs(capsys: pytest.CaptureFixture[str]) -> None:
    med = alternate(lambda tree, wd: {"x": 5.0}, None, 2, str, ["x"], "t-")
    assert med == {"this tree": {"x": 5.0}}
    assert "ratio" not in capsys.readouterr().out
