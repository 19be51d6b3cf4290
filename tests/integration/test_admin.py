"""Topic and config administration through real clients against real broker processes.

confluent-kafka's AdminClient (librdkafka), kafka-python's KafkaAdminClient and kcat talk
TCP to ``kafscale broker`` processes started here on free loopback ports (stopped by PID);
the two-broker test shares a real etcd.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.etcd import etcd_url, free_port  # noqa: F401 - fixture

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 30.0
TIMEOUT = 15.0


@dataclass
class BrokerProcess:
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


def start_broker(
    tmp: Path, meta: str = "embedded", node_id: int = 0, meta_prefix: str = "/kafscale"
) -> BrokerProcess:
    port = free_port()
    data = tmp / f"broker-{node_id}"
    data.mkdir(parents=True, exist_ok=True)
    log_path = data / "broker.log"
    args = [
        sys.executable, "-m", "broker.cli", "broker",
        "--listen", f"127.0.0.1:{port}",
        "--store", f"file://{tmp}/objects",
        "--meta", meta,
        "--meta-prefix", meta_prefix,
        "--data-dir", str(data),
        "--node-id", str(node_id),
        "--workers", "1",
        "--default-partitions", "2",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    broker = BrokerProcess(port, proc, log_path)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:  # start-up only: bounded polling
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited: {log_path.read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return broker
        except OSError:
            time.sleep(0.05)
    broker.stop()
    raise RuntimeError(f"broker did not listen within {START_TIMEOUT}s: {log_path}")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = start_broker(tmp_path)
    try:
        yield b
    finally:
        b.stop()


def _kcat_topics(bootstrap: str) -> dict[str, int]:
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed")
    out = subprocess.run(
        ["kcat", "-b", bootstrap, "-L", "-J", "-m", "10"],
        check=True,
        capture_output=True,
        timeout=30,
    ).stdout
    return {t["topic"]: len(t["partitions"]) for t in json.loads(out)["topics"]}


# ---------------------------------------------------------------- confluent-kafka


def _results(futures: dict[Any, Any]) -> dict[Any, Any]:
    """Each future's result, or its KafkaError code."""
    from confluent_kafka import KafkaException

    out = {}
    for key, fut in futures.items():
        try:
            out[key] = fut.result(timeout=TIMEOUT)
        except KafkaException as exc:
            out[key] = exc.args[0].code()
    return out


def test_confluent_admin_topics(broker: BrokerProcess) -> None:
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    created = _results(
        admin.create_topics(
            [
                NewTopic("orders", 3, 1, config={"retention.ms": "60000"}),
                NewTopic("defaults"),
                NewTopic("bad name", 1, 1),
                NewTopic("bad-policy", 1, 1, config={"cleanup.policy": "compact,purge"}),
                NewTopic("unknown-config", 1, 1, config={"no.such": "1"}),
                NewTopic("zero", 0, 1),
                NewTopic("rf", 1, 4),
            ],
            request_timeout=TIMEOUT,
        )
    )
    assert created == {
        "orders": None,
        "defaults": None,
        "bad name": KafkaError.TOPIC_EXCEPTION,
        "bad-policy": KafkaError.INVALID_CONFIG,
        "unknown-config": KafkaError.INVALID_CONFIG,
        "zero": KafkaError.INVALID_PARTITIONS,
        "rf": KafkaError.INVALID_REPLICATION_FACTOR,
    }
    again = _results(admin.create_topics([NewTopic("orders", 1, 1)], request_timeout=TIMEOUT))
    assert again == {"orders": KafkaError.TOPIC_ALREADY_EXISTS}
    md = admin.list_topics(timeout=TIMEOUT)
    assert {n: len(t.partitions) for n, t in md.topics.items()} == {"orders": 3, "defaults": 2}

    grown = _results(
        admin.create_partitions(
            [NewPartitions("orders", 5), NewPartitions("defaults", 1), NewPartitions("nope", 3)],
            request_timeout=TIMEOUT,
        )
    )
    assert grown == {
        "orders": None,
        "defaults": KafkaError.INVALID_PARTITIONS,
        "nope": KafkaError.UNKNOWN_TOPIC_OR_PART,
    }
    assert len(admin.list_topics("orders", timeout=TIMEOUT).topics["orders"].partitions) == 5
    assert _kcat_topics(broker.bootstrap) == {"orders": 5, "defaults": 2}

    deleted = _results(admin.delete_topics(["orders", "nope"], request_timeout=TIMEOUT))
    assert deleted == {"orders": None, "nope": KafkaError.UNKNOWN_TOPIC_OR_PART}
    assert set(admin.list_topics(timeout=TIMEOUT).topics) == {"defaults"}
    assert _kcat_topics(broker.bootstrap) == {"defaults": 2}


def test_confluent_admin_configs(broker: BrokerProcess) -> None:
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ConfigSource,
        NewTopic,
    )

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    _results(admin.create_topics([NewTopic("cfg", 1, 1, config={"retention.ms": "1000"})]))

    def describe(name: str) -> dict[str, Any]:
        (fut,) = admin.describe_configs([ConfigResource("topic", name)]).values()
        return dict(fut.result(timeout=TIMEOUT))

    cfg = describe("cfg")
    assert cfg["retention.ms"].value == "1000"
    assert cfg["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert cfg["cleanup.policy"].value == "delete"
    assert cfg["cleanup.policy"].source == ConfigSource.DEFAULT_CONFIG.value
    (fut,) = admin.describe_configs([ConfigResource("broker", "0")]).values()
    broker_cfg = fut.result(timeout=TIMEOUT)
    assert broker_cfg["num.partitions"].value == "2" and broker_cfg["num.partitions"].is_read_only

    (fut,) = admin.describe_configs([ConfigResource("topic", "missing")]).values()
    with pytest.raises(Exception, match="(?i)unknown topic"):
        fut.result(timeout=TIMEOUT)

    def incremental(*entries: ConfigEntry) -> Any:
        res = ConfigResource("topic", "cfg", incremental_configs=list(entries))
        return _results(admin.incremental_alter_configs([res]))[res]

    set_op, delete_op = AlterConfigOpType.SET, AlterConfigOpType.DELETE
    assert incremental(ConfigEntry("retention.bytes", "99", incremental_operation=set_op)) is None
    cfg = describe("cfg")
    assert (cfg["retention.ms"].value, cfg["retention.bytes"].value) == ("1000", "99")
    assert incremental(ConfigEntry("retention.ms", None, incremental_operation=delete_op)) is None
    assert describe("cfg")["retention.ms"].value == "604800000"
    bad = ConfigEntry("cleanup.policy", "purge", incremental_operation=AlterConfigOpType.APPEND)
    assert incremental(bad) == KafkaError.INVALID_CONFIG
    bad = ConfigEntry("retention.ms", "5", incremental_operation=AlterConfigOpType.APPEND)
    assert incremental(bad) == KafkaError.INVALID_CONFIG

    with warnings.catch_warnings():  # alter_configs (legacy, replaces the set) is deprecated
        warnings.simplefilter("ignore")
        res = ConfigResource("topic", "cfg", set_config={"segment.ms": "5000"})
        assert _results(admin.alter_configs([res]))[res] is None
    cfg = describe("cfg")
    assert cfg["segment.ms"].value == "5000" and cfg["retention.bytes"].value == "-1"


# ---------------------------------------------------------------- kafka-python


def test_kafka_python_admin(broker: BrokerProcess) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka.admin import (
            ConfigResource,
            ConfigResourceType,
            KafkaAdminClient,
            NewPartitions,
            NewTopic,
        )
        from kafka.errors import (
            InvalidConfigurationError,
            InvalidPartitionsError,
            InvalidTopicError,
            TopicAlreadyExistsError,
            UnknownTopicOrPartitionError,
        )

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
    try:
        admin.create_topics([NewTopic("kp", 2, 1, topic_configs={"retention.ms": "1234"})])
        assert "kp" in admin.list_topics()
        for topic, error in (
            (NewTopic("kp", 1, 1), TopicAlreadyExistsError),
            (NewTopic("bad/name", 1, 1), InvalidTopicError),
            (NewTopic("c", 1, 1, topic_configs={"cleanup.policy": "purge"}),
             InvalidConfigurationError),
        ):  # fmt: skip
            with pytest.raises(error):
                admin.create_topics([topic])
        admin.create_partitions({"kp": NewPartitions(4)})
        with pytest.raises(InvalidPartitionsError):
            admin.create_partitions({"kp": NewPartitions(3)})
        described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "kp")])
        assert described["topic"]["kp"]["retention.ms"]["value"] == "1234"
        res = ConfigResource(ConfigResourceType.TOPIC, "kp", configs={"retention.bytes": "7"})
        assert admin.alter_configs([res]) == {"topic": {"kp": "OK"}}
        described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "kp")])
        assert described["topic"]["kp"]["retention.bytes"]["value"] == "7"
        # kafka-python sends IncrementalAlterConfigs to brokers that have it: a SET
        assert described["topic"]["kp"]["retention.ms"]["value"] == "1234"
        assert _kcat_topics(broker.bootstrap) == {"kp": 4}
        admin.delete_topics(["kp"])
        assert "kp" not in admin.list_topics()
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.delete_topics(["kp"])
    finally:
        admin.close()


# ---------------------------------------------------------------- two brokers, one etcd


def test_topics_propagate_between_brokers(tmp_path: Path, etcd_url: str) -> None:  # noqa: F811
    from confluent_kafka.admin import AdminClient, NewTopic

    prefix = f"/admin-{uuid.uuid4().hex[:8]}"
    a = start_broker(tmp_path, etcd_url, node_id=0, meta_prefix=prefix)
    b = start_broker(tmp_path, etcd_url, node_id=1, meta_prefix=prefix)
    try:
        admin_a = AdminClient({"bootstrap.servers": a.bootstrap})
        _results(admin_a.create_topics([NewTopic("shared", 3, 1)], request_timeout=TIMEOUT))
        assert _wait_for(lambda: _kcat_topics(b.bootstrap).get("shared") == 3)
        admin_b = AdminClient({"bootstrap.servers": b.bootstrap})
        assert _results(admin_b.delete_topics(["shared"], request_timeout=TIMEOUT)) == {
            "shared": None
        }
        assert _wait_for(lambda: "shared" not in _kcat_topics(a.bootstrap))
    finally:
        a.stop()
        b.stop()


def _wait_for(cond: Any, timeout: float = TIMEOUT) -> bool:
    """Poll a client-side view (there is no event to wait on across processes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return False
