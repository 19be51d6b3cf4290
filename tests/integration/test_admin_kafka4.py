"""The admin APIs Kafka 4 tools call (issue 12), through kafka-python's KafkaAdminClient and
confluent-kafka's AdminClient over TCP, against two real broker processes sharing a real
etcd and one local store (so ElectLeaders forwarding and per-broker log dirs are real)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import kafka.errors as kerr
import pytest
from confluent_kafka import (
    ElectionType,
    KafkaException,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)
from kafka import KafkaAdminClient
from kafka import TopicPartition as KTP
from kafka.admin import NewTopic as KNewTopic
from kafka.protocol.admin import (
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
)
from kafka.protocol.producer import ProduceResponse
from kafka.structs import TopicPartitionReplica as TPR

from protocol.records import build_batch
from tests.fixtures.broker import BrokerProcess, start_broker
from tests.integration import kafka_raw as kr

pytestmark = pytest.mark.integration

WAIT = 30.0


class Pair:
    def __init__(self, brokers: list[BrokerProcess]) -> None:
        self.brokers = brokers
        self.bootstrap = ",".join(b.bootstrap for b in brokers)

    def kp_admin(self) -> KafkaAdminClient:
        return KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=30000)

    def ck_admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap})

    def create(self, topic: str, partitions: int, **configs: str) -> None:
        admin = self.ck_admin()
        new = NewTopic(topic, num_partitions=partitions, config=configs)
        admin.create_topics([new])[topic].result(WAIT)
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:  # both brokers see it (watch of another process)
            if all(self._knows(b, topic) for b in self.brokers):
                return
            time.sleep(0.05)
        raise AssertionError(f"{topic} never visible on both brokers")

    @staticmethod
    def _knows(b: BrokerProcess, topic: str) -> bool:
        md = kr.metadata(b.port, [topic])
        return md.topics[0].error_code == 0

    def leaders(self, topic: str) -> dict[int, tuple[int, int]]:
        """partition -> (leader id, leader epoch) from Metadata."""
        (t,) = kr.metadata(self.brokers[0].port, [topic]).topics
        return {p.partition_index: (p.leader_id, p.leader_epoch) for p in t.partitions}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, etcd_url: str) -> Iterator[Pair]:
    tmp = tmp_path_factory.mktemp("kafka4-admin")
    prefix = f"/k4-{uuid.uuid4().hex[:8]}"
    brokers: list[BrokerProcess] = []
    try:
        for node in (0, 1):
            brokers.append(
                start_broker(
                    tmp / f"node-{node}",
                    store_url=f"file://{tmp / 'store'}",
                    meta_url=etcd_url,
                    node_id=node,
                    extra_args=("--meta-prefix", prefix),
                )
            )
        pair = Pair(brokers)
        deadline = time.monotonic() + WAIT
        while len(kr.metadata(brokers[0].port, []).brokers) < 2:
            assert time.monotonic() < deadline, "the brokers never saw each other"
            time.sleep(0.05)
        yield pair
    finally:
        for b in brokers:
            b.stop()
    for b in brokers:
        assert "Traceback" not in b.log_text()


def _produce(bootstrap: str, topic: str, n: int, partition: int | None = None) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in range(n):
        kw: dict[str, Any] = {} if partition is None else {"partition": partition}
        p.produce(topic, key=str(i).encode(), value=b"v" * 100, **kw)
    assert p.flush(WAIT) == 0


def test_kafka_python_sees_a_4_0_broker_with_features(pair: Pair) -> None:
    admin = pair.kp_admin()
    try:
        for node in (0, 1):
            assert admin.get_broker_version_data(node).broker_version == (4, 0)
        features = admin.describe_features()
        assert features["metadata.version"]["finalized"] == (25, 25)
        assert features["metadata.version"]["supported"] == (7, 25)
        assert features["metadata.version"]["finalized_epoch"] is not None
        # features are fixed by the build: setting the current level is a no-op success
        assert admin.update_features({"metadata.version": 25}) == {"metadata.version": "OK"}
        with pytest.raises(kerr.InvalidUpdateVersionError):
            admin.update_features({"metadata.version": 24})
    finally:
        admin.close()


KAFKA3_CONFIGS = {
    "message.format.version": "2.8-IV1",
    "message.downconversion.enable": "false",
    "unclean.leader.election.enable": "false",
    "local.retention.ms": "600000",
    "local.retention.bytes": "1048576",
    "min.insync.replicas": "2",
    "preallocate": "true",
    "index.interval.bytes": "8192",
    "flush.messages": "1000",
}


def test_kafka3_topic_configs_accepted_and_described(pair: Pair) -> None:
    kp = pair.kp_admin()
    try:
        kp.create_topics([KNewTopic("cfg-kp", 1, 1, topic_configs=dict(KAFKA3_CONFIGS))])
    finally:
        kp.close()
    pair.create("cfg-ck", 1, **KAFKA3_CONFIGS)
    ck = pair.ck_admin()
    for topic in ("cfg-kp", "cfg-ck"):
        res = ConfigResource(ConfigResource.Type.TOPIC, topic)
        entries = ck.describe_configs([res])[res].result(WAIT)
        for name, value in KAFKA3_CONFIGS.items():
            assert entries[name].value == value, (topic, name)
    entry = ConfigEntry(
        "remote.storage.enable", "true", incremental_operation=AlterConfigOpType.SET
    )
    res = ConfigResource(ConfigResource.Type.TOPIC, "cfg-ck", incremental_configs=[entry])
    with pytest.raises(KafkaException, match="tiered storage is not implemented"):
        ck.incremental_alter_configs([res])[res].result(WAIT)


def test_describe_topic_partitions_pages_with_a_cursor(pair: Pair) -> None:
    pair.create("dtp-a", 5)
    pair.create("dtp-b", 3)
    admin = pair.kp_admin()
    seen: list[tuple[str, int, int]] = []
    pages = 0
    try:
        cursor = None
        while True:
            page = admin.describe_topic_partitions(
                ["dtp-b", "dtp-a", "dtp-missing"], response_partition_limit=3, cursor=cursor
            )
            pages += 1
            for t in page["topics"]:
                if t["name"] == "dtp-missing":
                    assert t["error_code"] == kerr.UnknownTopicOrPartitionError.errno
                    continue
                assert t["error_code"] == 0
                seen += [(t["name"], p["partition_index"], p["leader_id"]) for p in t["partitions"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
            assert pages < 10
    finally:
        admin.close()
    assert pages == 3  # 8 partitions, 3 per page
    assert [(n, p) for n, p, _ in seen] == [("dtp-a", i) for i in range(5)] + [
        ("dtp-b", i) for i in range(3)
    ]
    leaders = {**{("dtp-a", p): v[0] for p, v in pair.leaders("dtp-a").items()}}
    leaders.update({("dtp-b", p): v[0] for p, v in pair.leaders("dtp-b").items()})
    assert all(leaders[(n, p)] == leader for n, p, leader in seen)
    ck = pair.ck_admin()
    described = ck.describe_topics(TopicCollection(["dtp-a"]))["dtp-a"].result(WAIT)
    assert len(described.partitions) == 5


def test_log_dirs_one_dir_with_manifest_sizes(pair: Pair) -> None:
    pair.create("ld", 4)
    _produce(pair.bootstrap, "ld", 200)
    admin = pair.kp_admin()
    try:
        per_broker = admin.describe_log_dirs(["ld"])
        sizes: dict[int, int] = {}
        dirs: dict[int, str] = {}
        for entry in per_broker:
            (result,) = entry["log_dirs"]
            assert result["error_code"] == 0
            dirs[entry["broker"]] = result["log_dir"]
            for t in result["topics"]:
                for p in t["partitions"]:
                    assert p["partition_index"] not in sizes  # one host per partition
                    sizes[p["partition_index"]] = p["partition_size"]
                    assert p["offset_lag"] == 0 and not p["is_future_key"]
        assert sorted(sizes) == [0, 1, 2, 3]
        assert sum(sizes.values()) > 200 * 100  # the records' value bytes at least
        leaders = pair.leaders("ld")
        host = leaders[0][0]
        other = 1 - host
        moved = admin.alter_replica_log_dirs(
            {
                ("ld", 0, host): dirs[host],
                ("ld", 1, host): "/somewhere/else",
            }
        )
        assert moved[TPR("ld", 0, host)] is kerr.NoError
        assert moved[TPR("ld", 1, host)] is kerr.LogDirNotFoundError
        elsewhere = admin.alter_replica_log_dirs({("ld", 0, other): dirs[other]})
        assert elsewhere[TPR("ld", 0, other)] is kerr.ReplicaNotAvailableError
    finally:
        admin.close()


def test_elect_leaders_takes_unowned_partitions(pair: Pair) -> None:
    pair.create("el", 6)
    before = pair.leaders("el")
    assert all(epoch == -1 for _leader, epoch in before.values())  # nobody took them yet
    assert {leader for leader, _ in before.values()} == {0, 1}  # both brokers own some
    admin = pair.kp_admin()
    try:
        resp = admin.elect_leaders(0, {"el": list(range(6))})
        codes = {
            p.partition_id: p.error_code
            for r in resp.replica_election_results
            for p in r.partition_result
        }
        assert codes == dict.fromkeys(range(6), 0)
        deadline = time.monotonic() + WAIT
        while any(epoch < 1 for _l, epoch in pair.leaders("el").values()):
            assert time.monotonic() < deadline, pair.leaders("el")
            time.sleep(0.05)
        again = admin.elect_leaders(0, {"el": [0, 1]})
        codes = {
            p.partition_id: p.error_code
            for r in again.replica_election_results
            for p in r.partition_result
        }
        assert codes == dict.fromkeys([0, 1], kerr.ElectionNotNeededError.errno)
    finally:
        admin.close()
    ck = pair.ck_admin()
    result = ck.elect_leaders(ElectionType.PREFERRED, [TopicPartition("el", 2)]).result(WAIT)
    err = result[TopicPartition("el", 2)]
    assert err is not None and err.code() == kerr.ElectionNotNeededError.errno


def test_reassignments_listed_empty_and_refused(pair: Pair) -> None:
    pair.create("ra", 2)
    admin = pair.kp_admin()
    try:
        assert admin.list_partition_reassignments() == {}
        assert admin.list_partition_reassignments({"ra": [0, 1]}) == {}
        result = admin.alter_partition_reassignments({KTP("ra", 0): [1], KTP("ra", 1): None})
        assert result[KTP("ra", 0)] is kerr.InvalidReplicationAssignmentError
        assert result[KTP("ra", 1)] is kerr.NoReassignmentInProgressError
    finally:
        admin.close()


def test_describe_producers_shows_the_idempotent_producer(pair: Pair) -> None:
    pair.create("dp", 2)
    _produce(pair.bootstrap, "dp", 25, partition=1)
    admin = pair.kp_admin()
    try:
        states = admin.describe_producers([KTP("dp", 1), KTP("dp", 0)])
        (active,) = states[KTP("dp", 1)].active_producers
        assert active.producer_id >= 0 and active.producer_epoch >= 0
        assert active.last_sequence == 24  # 25 records, sequences 0..24
        assert active.current_transaction_start_offset in (-1, None)
        assert states[KTP("dp", 0)].active_producers == []
    finally:
        admin.close()


def test_describe_metadata_quorum(pair: Pair) -> None:
    admin = pair.kp_admin()
    try:
        quorum = admin.describe_metadata_quorum()
    finally:
        admin.close()
    (topic,) = quorum["topics"]
    assert topic["topic_name"] == "__cluster_metadata"
    (part,) = topic["partitions"]
    assert part["error"] is None
    assert part["leader_id"] == 0
    assert [v["replica_id"] for v in part["current_voters"]] == [0]
    assert [o["replica_id"] for o in part["observers"]] == [1]
    assert part["high_watermark"] > 0
    (node,) = quorum["nodes"]
    assert node["node_id"] == 0 and node["listeners"][0]["port"] == pair.brokers[0].port


def test_a_quota_set_on_one_broker_is_enforced_by_the_other(pair: Pair) -> None:
    """Quotas live in the metadata store (etcd here): set through broker 0, broker 1 sees
    the same record and throttles the client's produce (its 1 MB over a 1000 B/s quota)."""
    e = AlterClientQuotasRequest.EntryData
    alter = AlterClientQuotasRequest(
        entries=[
            e(
                entity=[e.EntityData(entity_type="client-id", entity_name="k4-slow")],
                ops=[e.OpData(key="producer_byte_rate", value=1000.0, remove=False)],
            )
        ],
        validate_only=False,
    )
    with kr.RawConn(pair.brokers[0].port) as c:
        assert c.call(alter, AlterClientQuotasResponse, 1).entries[0].error_code == 0
    comp = DescribeClientQuotasRequest.ComponentData
    describe = DescribeClientQuotasRequest(
        components=[comp(entity_type="client-id", match_type=0, match="k4-slow")], strict=True
    )
    deadline = time.monotonic() + WAIT
    while True:  # broker 1 learns it through its watch of the metadata store
        with kr.RawConn(pair.brokers[1].port) as c:
            got = c.call(describe, DescribeClientQuotasResponse, 1).entries
        if got:
            break
        assert time.monotonic() < deadline, "broker 1 never saw the quota"
        time.sleep(0.05)
    assert [(v.key, v.value) for v in got[0].values] == [("producer_byte_rate", 1000.0)]
    pair.create("qt", 1)
    batch = build_batch([(b"k", bytes(range(256)) * 1024, None)] * 4)  # ~1 MB
    with kr.RawConn(pair.brokers[1].port) as c:
        c.send(kr.request_bytes(kr.produce_request("qt", 0, batch), 8, 7, "k4-slow"))
        frame = c.recv_frame()
    assert frame is not None
    resp = ProduceResponse.decode(frame, version=8, header=True)
    # 1 MB against 1000 B/s over Kafka's 10 s minimum window: ~100 s of delay
    assert resp.throttle_time_ms > 60_000
