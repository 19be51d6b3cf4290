"""A Quix Streams stateful application keeps its state in a compacted changelog topic.

Run 1 counts N1 records per key (its state in RocksDB, every update also in the
changelog topic Quix creates with ``cleanup.policy=compact``); the broker compacts the
changelog; the application's state directory is deleted; run 2 restores the state from
the compacted changelog and counts N2 more records: every count is the same as without
the deletion.

quixstreams pins confluent-kafka below the project's version, so it lives in a virtualenv
of its own, ``.venv-quix`` (``scripts/setup.sh --test`` builds it from
``tests/integration/quix/requirements.lock``); the application runs there as a process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.fixtures.broker import REPO, start_broker
from tests.integration.test_compaction import FAST, read_partition
from tests.integration.test_retention import Backend, create_topic, wait_for

pytestmark = pytest.mark.integration

QUIX_PYTHON = Path(os.environ.get("KAFSCALE_QUIX_PYTHON", REPO / ".venv-quix" / "bin" / "python"))
APP = Path(__file__).parent / "quix" / "counter_app.py"
WORDS = [f"w{i}" for i in range(12)]
TIMEOUT = 120.0


def _produce(bootstrap: str, topic: str, keys: list[str]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i, k in enumerate(keys):
        p.produce(topic, key=k.encode(), value=f"r{i}".encode())
    assert p.flush(30) == 0


def _run_app(bootstrap: str, args: list[str], n: int, log: Path) -> None:
    with open(log, "ab") as out:
        proc = subprocess.run(
            [str(QUIX_PYTHON), str(APP), bootstrap, *args, str(n)],
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=TIMEOUT,
            check=False,
        )
    assert proc.returncode == 0, log.read_text()[-3000:]


def test_state_restored_from_compacted_changelog(tmp_path: Path) -> None:
    if not QUIX_PYTHON.exists():
        pytest.skip("Quix Streams test needs .venv-quix: run scripts/setup.sh --test")
    be = Backend(tmp_path, {})
    broker = start_broker(tmp_path, extra_args=FAST)
    try:
        source, sink, group = (f"{x}-{uuid.uuid4().hex[:6]}" for x in ("words", "counts", "g"))
        create_topic(broker.bootstrap, source)
        create_topic(broker.bootstrap, sink)
        first = [WORDS[(i * 7) % len(WORDS)] for i in range(300)]
        second = [WORDS[(i * 5) % len(WORDS)] for i in range(200)]
        state = tmp_path / "state"
        log = tmp_path / "app.log"
        _produce(broker.bootstrap, source, first)
        _run_app(broker.bootstrap, [source, sink, str(state), group], len(first), log)
        (changelog,) = [t for t in _topics(broker.bootstrap) if t.startswith("changelog__")]
        # the changelog (300 updates of 12 keys) is compacted before the state is lost
        wait_for(
            "the changelog compacted",
            lambda: (
                any(e.get("cleaned") for e in be.manifest(changelog))
                and sum(e["records"] for e in be.manifest(changelog)) < len(first)
            ),
            TIMEOUT,
        )
        shutil.rmtree(state)
        _produce(broker.bootstrap, source, second)
        _run_app(broker.bootstrap, [source, sink, str(state), group], len(second), log)
        outputs = [json.loads(v) for _o, _k, v in read_partition(broker.bootstrap, sink) if v]
        assert len(outputs) == len(first) + len(second)
        seen: Counter[str] = Counter()
        for i, (word, out) in enumerate(zip(first + second, outputs, strict=True)):
            seen[word] += 1
            assert (out["key"], out["count"]) == (word, seen[word]), (i, out)
    finally:
        broker.stop()


def _topics(bootstrap: str) -> list[str]:
    from confluent_kafka.admin import AdminClient

    admin: Any = AdminClient({"bootstrap.servers": bootstrap})
    return list(admin.list_topics(timeout=30).topics)
