"""``bench.fs_probe.new_workdir``: a harness's work directory goes when its process ends,
whether or not the harness removes it itself (round 24: several left GBs behind)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = """
import sys
from bench.fs_probe import new_workdir
work = new_workdir("harness-")
(work / "b").mkdir()
(work / "b" / "segment.kfs").write_bytes(b"x" * 4096)
print(work, flush=True)
sys.exit(int(sys.argv[1]))
"""


@pytest.mark.parametrize("code", [0, 3])
def test_a_work_directory_is_removed_when_the_process_exits(tmp_path: Path, code: int) -> None:
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(code)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == code, proc.stderr[-2000:]
    work = Path(proc.stdout.strip())
    assert work.parent == tmp_path / "kafscale-bench"
    assert work.parent.is_dir() and not work.exists()
