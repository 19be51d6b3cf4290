"""``bench.mock_rtt``: librdkafka's mock cluster with a simulated round trip beside this
broker, in one run; every target's row printed with its figures (round 25)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


def test_every_target_gets_its_figures(tmp_path: Path) -> None:
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "bench.mock_rtt", "--rtts", "0,2", "--messages", "3000",
           "--rounds", "1", "--modes", "idem,plain"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = re.findall(r"^  (\S+)\s+([\d.]+) MB/s  client\s+([\d.]+) ms/MB(.*)$", proc.stdout, re.M)
    assert [r[0] for r in rows] == ["local", "mock", "mock+2ms"] * 2, proc.stdout
    assert all(float(mbs) > 0 and float(client) > 0 for _n, mbs, client, _rest in rows)
    assert all(("broker Produce p50" in rest) == (name == "local") for name, *_x, rest in rows)
    assert proc.stdout.count("MB/s against the mock without a round trip: local") == 2
    assert not any((tmp_path / "kafscale-bench").iterdir())  # its work directory is gone
