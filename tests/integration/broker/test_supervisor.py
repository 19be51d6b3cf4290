"""The ``--workers`` supervisor (broker/workers.py) with stand-in workers, real processes:
worker 0 ignores SIGTERM, worker 1 exits at every start. After giving up on worker 1 the
supervisor SIGTERMs worker 0, kills it once ``FAILED_STOP_GRACE_S`` has passed, and exits 1
(without the kill it waited forever). The broker itself as a worker: test_workers.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.fixtures.broker import REPO

pytestmark = pytest.mark.integration

DRIVER = """
import logging, subprocess, sys, time
import broker.workers as w
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
w.FAILED_STOP_GRACE_S = 2.0
w.RESTART_DELAY_S = 0.05
HANG = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "time.sleep(600)")
class StandIns(w.Supervisor):
    def _spawn(self, worker):
        code = HANG if worker.plan.index == 0 else "raise SystemExit(3)"
        worker.proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        worker.started_at = time.monotonic()
        print("spawned", worker.plan.index, worker.proc.pid, flush=True)
plans = [w.WorkerPlan(i, 40 + i, i, ("127.0.0.1", 9092 + i)) for i in range(2)]
sys.exit(StandIns([], plans).run())
"""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER], cwd=REPO, capture_output=True, text=True, timeout=240
    )
    spawned = [line.split() for line in proc.stdout.splitlines() if line.startswith("spawned")]
    hung = [int(pid) for _, index, pid in spawned if index == "0"]
    try:
        assert proc.returncode == 1, proc.stderr
        assert "worker 1 keeps exiting" in proc.stderr
        assert "still runs 2 s after SIGTERM: killing it" in proc.stderr
        assert len(hung) == 1 and _gone(hung[0])
    finally:
        for pid in hung:
            if not _gone(pid):
                os.kill(pid, 9)
