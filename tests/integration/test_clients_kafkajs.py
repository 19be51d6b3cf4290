"""kafkajs (Node.js client) against a real ``kafscale broker`` over TCP.

``tests/integration/js`` pins kafkajs in its lock file; the fixture installs it with
``npm ci``. kafkajs ships gzip only (snappy/lz4/zstd need codec plug-ins), so its
producer is exercised with no compression and with gzip.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.broker import BrokerProcess
from tests.integration.conftest import TIMEOUT, create_topic, unique_topic
from tests.integration.test_clients_confluent import consume, produce_acked, producer

pytestmark = pytest.mark.integration

JS_DIR = Path(__file__).resolve().parent / "js"


@pytest.fixture(scope="module")
def kafkajs() -> Path:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        print("kafkajs tests skipped: node or npm is not on PATH")
        pytest.skip("node or npm is not on PATH")
    if not (JS_DIR / "node_modules" / "kafkajs" / "package.json").exists():
        proc = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=JS_DIR,
            capture_output=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return JS_DIR


def run_js(js_dir: Path, *args: str) -> Any:
    proc = subprocess.run(
        ["node", str(js_dir / "client.js"), *args], capture_output=True, timeout=90
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return json.loads(proc.stdout)


@pytest.mark.parametrize("codec", ["none", "gzip"])
def test_kafkajs_produce_confluent_consume(
    any_broker: BrokerProcess, kafkajs: Path, codec: str
) -> None:
    topic = unique_topic(f"js-prod-{codec}")
    n = 250
    md = run_js(kafkajs, "produce", any_broker.bootstrap, topic, str(n), codec, "false")
    assert all(m["errorCode"] == 0 and m["partition"] == 0 for m in md)
    assert sorted(int(m["baseOffset"]) for m in md) == list(range(0, n + 2, 100))
    got = consume(any_broker.bootstrap, topic, {0: 0}, n + 2)
    assert [r.offset for r in got] == list(range(n + 2))
    for i, r in enumerate(got[:n]):
        assert (r.key, r.value) == (f"key-{i % 7}".encode(), f"value-{i}".encode())
        assert list(r.headers) == [("seq", f"{i}".encode()), ("src", b"kafkajs")]
    assert (got[n].key, got[n].value, got[n].timestamp) == (None, b"null-key", 1700000000999)
    assert (got[n + 1].key, got[n + 1].value) == (b"tombstone", None)


def test_kafkajs_idempotent_producer(shared_broker: BrokerProcess, kafkajs: Path) -> None:
    topic = unique_topic("js-idem")
    create_topic(shared_broker.bootstrap, topic, 3)
    n = 400
    md = run_js(kafkajs, "produce", shared_broker.bootstrap, topic, str(n), "gzip", "true")
    assert all(m["errorCode"] == 0 for m in md)
    got = consume(shared_broker.bootstrap, topic, {p: 0 for p in range(3)}, n + 2)
    values = sorted(r.value for r in got if r.value is not None)
    assert values == sorted([f"value-{i}".encode() for i in range(n)] + [b"null-key"])
    for part in range(3):
        offs = sorted(r.offset for r in got if r.partition == part)
        assert offs == list(range(len(offs)))


def test_kafkajs_consumer_run_and_admin_offsets(any_broker: BrokerProcess, kafkajs: Path) -> None:
    topic = unique_topic("js-cons")
    create_topic(any_broker.bootstrap, topic, 3)
    items: list[dict[str, Any]] = [
        {
            "partition": i % 3,
            "key": b"k%d" % i,
            "value": b"v%d" % i,
            "timestamp": 1_600_000_000_000 + i,
        }
        for i in range(90)
    ]
    items.append({"partition": 0, "key": None, "value": None, "headers": [("h", b"x")]})
    # gzip: kafkajs decodes it natively (snappy needs a codec plugin kafkajs does not ship;
    # librdkafka sends small batches uncompressed, so snappy passed only while batches
    # stayed small, i.e. not on a busy machine)
    p = producer(any_broker.bootstrap, **{"linger.ms": 5, "compression.type": "gzip"})
    acks = produce_acked(p, topic, items)
    got = run_js(kafkajs, "consume", any_broker.bootstrap, topic, str(len(items)), topic + "-g")
    assert sorted((m["partition"], m["offset"]) for m in got) == sorted(
        (a.partition, a.offset) for a in acks
    )
    by_value = {m["value"]: m for m in got}
    for i in range(90):
        m = by_value[f"v{i}"]
        assert (m["partition"], m["key"], m["timestamp"]) == (i % 3, f"k{i}", 1_600_000_000_000 + i)
    assert by_value[None]["key"] is None and by_value[None]["headers"] == {"h": "x"}

    offs = run_js(kafkajs, "offsets", any_broker.bootstrap, topic, str(1_600_000_000_000 + 45))
    latest = {o["partition"]: (int(o["low"]), int(o["high"])) for o in offs["latest"]}
    assert latest == {0: (0, 31), 1: (0, 30), 2: (0, 30)}
    # record i sits at partition i % 3, offset i // 3: first timestamp >= +45 per partition
    by_time = {o["partition"]: int(o["offset"]) for o in offs["byTime"]}
    assert by_time == {0: 15, 1: 15, 2: 15}
    assert TIMEOUT > 0
