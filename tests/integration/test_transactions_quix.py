"""Quix Streams with processing_guarantee="exactly-once" against a real broker: 1000
records in, exactly 1000 out under read_committed, across a ``kill -9`` of the
application mid-run and a restart. Quix runs in its own virtualenv (``.venv-quix``,
made by ``scripts/setup.sh --test`` from ``tests/integration/quix/requirements.lock``)
because it pins confluent-kafka below the project's version."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.fixtures.broker import BrokerProcess
from tests.integration.conftest import TIMEOUT, create_topic, unique_topic
from tests.integration.test_transactions import consume_all, txn_broker  # noqa: F401

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
APP = Path(__file__).resolve().parent / "quix" / "eos_app.py"
RECORDS = 1000


def quix_python() -> str:
    path = os.environ.get("KAFSCALE_QUIX_PYTHON") or str(REPO / ".venv-quix" / "bin" / "python")
    if not Path(path).exists():
        print(f"Quix test skipped: no {path} (run scripts/setup.sh --test)")
        pytest.skip("Quix Streams virtualenv missing")
    return path


def test_quix_exactly_once_across_a_kill(txn_broker: BrokerProcess, tmp_path: Path) -> None:  # noqa: F811
    from confluent_kafka import Producer

    python = quix_python()
    bootstrap = txn_broker.bootstrap
    src, dst = unique_topic("quix-in"), unique_topic("quix-out")
    create_topic(bootstrap, src, 2)
    create_topic(bootstrap, dst, 2)
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(RECORDS):
        p.produce(src, f"m{i}".encode(), partition=i % 2)
    assert p.flush(TIMEOUT) == 0
    group = f"quix-{uuid.uuid4().hex[:6]}"
    args = [python, str(APP), bootstrap, src, dst, group]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with (tmp_path / "quix-1.log").open("wb") as log:
        first = subprocess.Popen([*args, "0"], stdout=subprocess.PIPE, stderr=log, env=env)
        try:
            assert first.stdout is not None
            for line in first.stdout:  # the application's own progress lines
                if line.startswith(b"processed ") and int(line.split()[1]) >= 400:
                    break
            else:
                raise AssertionError((tmp_path / "quix-1.log").read_text()[-3000:])
        finally:
            first.kill()  # kill -9 mid-run: its open transaction is aborted later
            first.wait(30)
            if first.stdout is not None:
                first.stdout.close()
    second = subprocess.run([*args, "8"], capture_output=True, timeout=240, env=env)
    assert second.returncode == 0, second.stderr.decode(errors="replace")[-3000:]
    got = consume_all(bootstrap, dst, 2, "read_committed", RECORDS)
    values = sorted(v for _, _, v in got)
    assert values == sorted(f"m{i}".encode() for i in range(RECORDS))  # each exactly once
