"""KIP-951 leader hints from real brokers on etcd (broker/handlers/leader_hints.py): a
broker that does not own a partition answers NOT_LEADER_OR_FOLLOWER naming the owner and
its epoch (Produce v10+, Fetch v12+) and the owner's endpoint (Produce v10+, Fetch v16+);
older versions get no hint. Then a real librdkafka producer writes through a move."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from protocol.records import build_batch
from tests.integration import kafka_raw as kr
from tests.integration.zombie_cluster import (
    WAIT,
    ZCluster,
    assert_exactly,
    topic_owned_by,
)

# placement does not depend on the store: the shared directory store with etcd only (the
# durability tests' ``zc`` runs SeaweedFS as well)
pytestmark = [pytest.mark.integration, pytest.mark.parametrize("zc", ["file"], indirect=True)]

MOVED = 6  # NOT_LEADER_OR_FOLLOWER


def produce(port: int, topic: str, version: int) -> Any:
    T = ProduceRequest.TopicProduceData
    req = ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout_ms=10_000,
        topic_data=[
            T(name=topic, partition_data=[T.PartitionProduceData(index=0, records=_batch())])
        ],
    )
    with kr.RawConn(port) as c:
        return c.call(req, ProduceResponse, version)


def _batch() -> bytes:
    return build_batch([(None, b"hint", None)])


def fetch(port: int, topic: str, topic_id: uuid.UUID, version: int) -> Any:
    T = FetchRequest.FetchTopic
    part = T.FetchPartition(
        partition=0,
        current_leader_epoch=-1,
        fetch_offset=0,
        last_fetched_epoch=-1,
        log_start_offset=-1,
        partition_max_bytes=1 << 20,
    )
    req = kr.fetch_request([T(topic=topic, topic_id=topic_id, partitions=[part])])
    with kr.RawConn(port) as c:
        return c.call(req, FetchResponse, version)


def test_a_broker_names_the_owner_of_a_partition_it_does_not_own(zc: ZCluster) -> None:
    zc.start(1)
    zc.start(2)
    topic = topic_owned_by("hints", 2, [1, 2])
    admin = AdminClient({"bootstrap.servers": zc.brokers[1].bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result(30)
    acked = zc.produce(topic, 0, [b"first"])  # through broker 2: it takes the partition
    one, two = zc.brokers[1].port, zc.brokers[2].port
    (t,) = kr.metadata(two, [topic], version=12).topics
    epoch = next(p.leader_epoch for p in t.partitions)
    assert epoch >= 1

    deadline = time.monotonic() + WAIT
    while True:  # broker 1 learns the owner's epoch through its watch
        r = produce(one, topic, 10)
        (part,) = r.responses[0].partition_responses
        assert part.error_code == MOVED, part
        if part.current_leader is not None:
            break
        assert time.monotonic() < deadline, "broker 1 never named the owner"
        time.sleep(0.05)
    assert (part.current_leader.leader_id, part.current_leader.leader_epoch) == (2, epoch)
    assert [(n.node_id, n.host, n.port) for n in r.node_endpoints] == [(2, "127.0.0.1", two)]
    (part,) = produce(one, topic, 9).responses[0].partition_responses
    assert part.error_code == MOVED and getattr(part, "current_leader", None) is None

    for version, endpoints in ((12, False), (15, False), (16, True), (17, True)):
        r = fetch(one, topic, t.topic_id, version)
        (p,) = r.responses[0].partitions
        assert p.error_code == MOVED, (version, p)
        assert (p.current_leader.leader_id, p.current_leader.leader_epoch) == (2, epoch)
        got = [(n.node_id, n.port) for n in getattr(r, "node_endpoints", None) or []]
        assert got == ([(2, two)] if endpoints else []), version
    (p,) = fetch(one, topic, t.topic_id, 11).responses[0].partitions
    assert p.error_code == MOVED and getattr(p, "current_leader", None) is None

    # a real client bootstrapped on broker 1 writes to broker 2's partition
    producer = Producer({"bootstrap.servers": zc.brokers[1].bootstrap, "enable.idempotence": True})
    delivered: list[tuple[Any, Any]] = []
    for i in range(5):
        producer.produce(topic, f"client-{i}".encode(), partition=0,
                         on_delivery=lambda err, msg: delivered.append((err, msg)))  # fmt: skip
    assert producer.flush(WAIT) == 0
    assert all(err is None for err, _ in delivered), delivered
    acked |= {msg.value(): msg.offset() for _, msg in delivered}
    assert_exactly(zc.read(topic, 0), acked)
