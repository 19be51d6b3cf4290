"""``bench.broker --partition-sweep``: every target, the mock too, produces at each
partition count; the mock's topics get those partitions (through its host), and the
verdict judges the broker against the mock's counterpart (round 29)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


def test_the_sweep_runs_the_mock_at_every_partition_count(tmp_path: Path) -> None:
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "bench.broker", "--quick", "--targets", "local,mock",
           "--partition-sweep", "1,6", "--messages", "3000"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    points = re.findall(
        r"^  partitions (\S+)\s+(\d+): +([\d.]+) MB/s.*(\d+) errors", proc.stdout, re.M
    )
    assert [(name, n) for name, n, _mbs, _e in points] == [
        ("local", "1"),
        ("mock", "1"),
        ("local", "6"),
        ("mock", "6"),
    ], proc.stdout
    assert all(float(mbs) > 0 and errors == "0" for _n, _c, mbs, errors in points)
    verdicts = proc.stdout.split("many-partition goal", 1)[1]
    assert re.search(r"^  local   MB/s at 1/6 partitions: .*  (met|NOT met)$", verdicts, re.M)
    assert re.search(r"^  mock    MB/s at 1/6 partitions: .*  counterpart$", verdicts, re.M)
    assert re.search(
        r"^  local   MB/s / the mock's at 1/6 partitions: [\d.]+/[\d.]+$", verdicts, re.M
    )
    assert not any((tmp_path / "kafscale-bench").iterdir())  # its work directory is gone
