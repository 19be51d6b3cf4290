"""``bench.membership``: producers through a broker joining and leaving, on a real etcd
(one short round of this tree)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


def test_a_round_reports_both_events_and_what_moved(tmp_path: Path) -> None:
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "bench.membership", "--partitions", "6", "--settle-s", "2"]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = re.search(
        r"^round 1 this tree: join max +([\d.]+) ms p99 +([\d.]+) ms slow +(\d+)/6"
        r"  leave max +([\d.]+) ms p99 +([\d.]+) ms slow +(\d+)/6  moved (\d+)/6$",
        proc.stdout,
        re.M,
    )
    assert m, proc.stdout
    join_max, join_p99, _, leave_max, leave_p99, _, moved = m.groups()
    assert float(join_max) >= float(join_p99) > 0 and float(leave_max) >= float(leave_p99) > 0
    assert 0 < int(moved) < 6  # broker 2 led some partitions, broker 1 the others
