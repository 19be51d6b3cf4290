"""A SIGTERM that reaches a broker while it starts is a clean stop once it has started,
not the default action (the process killed by the signal): broker/server.py installs its
signal handlers before the broker binds and listens.

Deterministic: the broker freezes itself at ``start.before_serving``, the signal is sent
while it is stopped (so it is pending when it wakes), then it is woken."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.fixtures.broker import BrokerProcess, start_broker
from tests.integration.zombie_cluster import wait_frozen_at

pytestmark = pytest.mark.integration

WAIT = 120.0


def _frozen_at_start(tmp_path: Path) -> BrokerProcess:
    """A broker stopped by its own fault checkpoint before it listens."""
    b = start_broker(
        tmp_path / "b",
        env={"KAFSCALE_FAULT_PAUSE": "start.before_serving"},
        await_listener=False,
    )
    try:
        wait_frozen_at(b, "start.before_serving", WAIT)
    except AssertionError:
        b.kill9()
        raise
    return b


def test_a_sigterm_during_start_is_a_clean_stop(tmp_path: Path) -> None:
    b = _frozen_at_start(tmp_path)
    try:
        os.kill(b.pid, signal.SIGTERM)  # pending while it is stopped
        os.kill(b.pid, signal.SIGCONT)
        assert b.proc is not None
        assert b.proc.wait(WAIT) == 0, b.log_text()
    finally:
        b.kill9()
    log = b.log_text()
    assert "shutting down: flushing buffers and releasing partitions" in log
    assert "Traceback" not in log


def test_a_second_signal_during_start_ends_the_process_at_once(tmp_path: Path) -> None:
    """The way out of a start that takes long: SIGTERM and SIGINT, both pending when it
    wakes; whichever is handled second is its default action (the process ends by that
    signal). Which one comes second is the kernel's choice: pending signals are taken
    lowest number first, but by whichever of the process's threads takes them."""
    b = _frozen_at_start(tmp_path)
    try:
        os.kill(b.pid, signal.SIGTERM)
        os.kill(b.pid, signal.SIGINT)
        os.kill(b.pid, signal.SIGCONT)
        assert b.proc is not None
        rc = b.proc.wait(WAIT)
    finally:
        b.kill9()
    log = b.log_text()
    assert rc in (-signal.SIGINT, -signal.SIGTERM), log
    second = signal.Signals(-rc)
    assert f"{second.name} again while starting: exiting at once" in log, log
    assert "Traceback" not in log
