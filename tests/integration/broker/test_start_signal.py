"""A SIGTERM that reaches a broker while it starts is a clean stop once it has started,
not the default action (the process killed by the signal): broker/server.py installs its
signal handlers before the broker binds and listens.

Deterministic: the broker freezes itself at ``start.before_serving``, the signal is sent
while it is stopped (so it is pending when it wakes), then it is woken."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.fixtures.broker import start_broker
from tests.integration.zombie_cluster import stopped

pytestmark = pytest.mark.integration

WAIT = 120.0


def test_a_sigterm_during_start_is_a_clean_stop(tmp_path: Path) -> None:
    b = start_broker(
        tmp_path / "b",
        env={"KAFSCALE_FAULT_PAUSE": "start.before_serving"},
        await_listener=False,
    )
    try:
        deadline = time.monotonic() + WAIT
        while not (stopped(b.pid) and "start.before_serving: pausing" in b.log_text()):
            assert b.proc is not None and b.proc.poll() is None, b.log_text()
            assert time.monotonic() < deadline, b.log_text()
            time.sleep(0.05)  # another process's state: polled
        os.kill(b.pid, signal.SIGTERM)  # pending while it is stopped
        os.kill(b.pid, signal.SIGCONT)
        assert b.proc is not None
        assert b.proc.wait(WAIT) == 0, b.log_text()
    finally:
        b.kill9()
    log = b.log_text()
    assert "shutting down: flushing buffers and releasing partitions" in log
    assert "Traceback" not in log
