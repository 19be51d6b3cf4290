"""``bench.fs_probe``: the file-creation probe every ``bench.broker`` report carries."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from bench.fs_probe import (
    bench_dir,
    creation_ms,
    describe,
    mark_topdir,
    new_workdir,
    topdir_marked,
)


def test_the_probe_creates_its_files_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "kept").write_bytes(b"x")
    made: list[str] = []
    real_open = os.open

    def counting_open(path: os.PathLike[str] | str, flags: int, *args: int, **kwargs: Any) -> int:
        if flags & os.O_CREAT:
            made.append(os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    ms = creation_ms(tmp_path, files=25)
    assert ms > 0
    assert len(made) == 25 and len(set(made)) == 25  # every one a new file
    assert all(Path(p).parent.parent == tmp_path for p in made)  # in a directory of its own
    assert [p.name for p in tmp_path.iterdir()] == ["kept"]  # removed again


def test_the_report_line_gives_the_figure() -> None:
    line = describe(0.4567)
    assert line.startswith("file creation in the work directory: 0.457 ms per file")
    assert "Round 22" in line


def test_work_directories_are_made_under_a_top_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    parent = bench_dir()
    assert parent == tmp_path / "kafscale-bench" and parent.is_dir()
    a, b = new_workdir("run-"), new_workdir("run-")
    assert a != b and a.parent == parent == b.parent and a.name.startswith("run-")
    assert not any(a.iterdir())
    try:
        again = mark_topdir(parent)
    except OSError as exc:
        pytest.skip(f"{tmp_path}'s file system has no top-directory attribute ({exc})")
    assert again is False  # bench_dir had set it: ext4 spreads the subdirectories
    assert topdir_marked(parent)
    assert bench_dir() == parent and topdir_marked(parent)
