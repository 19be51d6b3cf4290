"""A forwarded ElectLeaders between brokers that only have SASL listeners (real etcd,
``--authorizer`` on; docs/operations.md "Inter-broker requests"). Broker 0 logs in to
its peer as ``User:admin`` (``--inter-broker-sasl-*``), so partitions broker 1 owns are
taken by broker 1 through it; broker 1 has no inter-broker credentials, so the
partitions it would forward answer PREFERRED_LEADER_NOT_AVAILABLE naming the flags."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import (
    CreateTopicsRequest,
    CreateTopicsResponse,
    ElectLeadersRequest,
    ElectLeadersResponse,
)
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from tests.fixtures.broker import BrokerProcess, free_port
from tests.integration.kafka_raw import RawConn
from tests.integration.security.conftest import kafscale
from tests.integration.security.raw_sasl import login
from tests.integration.spread import spread_topic

pytestmark = pytest.mark.integration
WAIT = 30.0
PREFERRED_LEADER_NOT_AVAILABLE = 80


@pytest.fixture(scope="module")
def sasl_pair(tmp_path_factory: pytest.TempPathFactory, etcd_url: str) -> Iterator[list[int]]:
    tmp: Path = tmp_path_factory.mktemp("inter-broker")
    prefix = f"/ib-{uuid.uuid4().hex[:8]}"
    r = kafscale("users", "--meta", etcd_url, "--meta-prefix", prefix, "create", "admin",
                 "--password", "admin-pw", "--mechanism", "SCRAM-SHA-512")  # fmt: skip
    assert r.returncode == 0, r.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
    brokers: list[BrokerProcess] = []
    try:
        for node in (0, 1):
            port = free_port()
            args = ["--node-id", str(node), "--store", f"file://{tmp / 'store'}",
                    "--meta", etcd_url, "--meta-prefix", prefix, "--lease-ttl", "3",
                    "--listener", f"SASL_PLAINTEXT://127.0.0.1:{port}",
                    "--authorizer", "true", "--super-users", "User:admin"]  # fmt: skip
            if node == 0:
                args += ["--inter-broker-sasl-mechanism", "SCRAM-SHA-512",
                         "--inter-broker-sasl-username", "admin"]  # fmt: skip
                env0 = {**env, "KAFSCALE_INTER_BROKER_SASL_PASSWORD": "admin-pw"}
            workdir = tmp / f"b{node}"
            workdir.mkdir()
            b = BrokerProcess(workdir, port, args, env0 if node == 0 else env)
            brokers.append(b.start())
        yield [b.port for b in brokers]
    finally:
        for b in brokers:
            b.stop()


def call(port: int, req: Any, resp_cls: Any, version: int) -> Any:
    with RawConn(port) as c:
        login(c, "admin", "admin-pw", "SCRAM-SHA-512")
        return c.call(req, resp_cls, version, 10)


def leaders(port: int, topic: str) -> dict[int, tuple[int, int]]:
    req = MetadataRequest(topics=[(topic,)], allow_auto_topic_creation=False)
    (t,) = call(port, req, MetadataResponse, 9).topics
    return {p.partition_index: (p.leader_id, p.leader_epoch) for p in t.partitions}


def create(ports: list[int], topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    t = CreateTopicsRequest.CreatableTopic
    req = CreateTopicsRequest(topics=[t(name=topic, num_partitions=partitions,
                                        replication_factor=1, assignments=[], configs=[])],
                              timeout_ms=10000, validate_only=False)  # fmt: skip
    assert call(ports[0], req, CreateTopicsResponse, 5).topics[0].error_code == 0
    deadline = time.monotonic() + WAIT
    while True:  # both brokers see it, and both own some of its partitions
        try:
            seen = [leaders(p, topic) for p in ports]
        except ValueError:
            seen = []
        if len(seen) == 2 and all(len(s) == partitions for s in seen):
            owners = {leader for leader, _ in seen[0].values()}
            if owners == {0, 1}:
                return seen[0]
        assert time.monotonic() < deadline, f"{topic} not visible on both brokers: {seen}"
        time.sleep(0.05)


def elect(port: int, topic: str, partitions: int) -> dict[int, tuple[int, str | None]]:
    tp = ElectLeadersRequest.TopicPartitions(topic=topic, partitions=list(range(partitions)))
    req = ElectLeadersRequest(election_type=0, topic_partitions=[tp], timeout_ms=10000)
    resp = call(port, req, ElectLeadersResponse, 2)
    assert resp.error_code == 0
    return {
        p.partition_id: (p.error_code, p.error_message)
        for r in resp.replica_election_results
        for p in r.partition_result
    }


def test_forwarded_election_logs_in_to_the_peer(sasl_pair: list[int]) -> None:
    topic = spread_topic("ib", [0, 1], 8)
    before = create(sasl_pair, topic, 8)
    assert all(epoch == -1 for _l, epoch in before.values())  # nobody took them yet
    got = elect(sasl_pair[0], topic, 8)
    assert {p: code for p, (code, _m) in got.items()} == dict.fromkeys(range(8), 0), got
    deadline = time.monotonic() + WAIT
    while any(epoch < 1 for _l, epoch in leaders(sasl_pair[0], topic).values()):
        assert time.monotonic() < deadline, leaders(sasl_pair[0], topic)
        time.sleep(0.05)


def test_without_inter_broker_credentials_the_forward_fails_clearly(
    sasl_pair: list[int],
) -> None:
    topic = spread_topic("ib-no", [0, 1], 8)
    before = create(sasl_pair, topic, 8)
    got = elect(sasl_pair[1], topic, 8)  # broker 1 has no --inter-broker-sasl-*
    for p, (leader, _epoch) in before.items():
        code, msg = got[p]
        if leader == 1:
            assert code == 0
        else:
            assert code == PREFERRED_LEADER_NOT_AVAILABLE
            assert msg is not None and "--inter-broker-sasl-username" in msg
