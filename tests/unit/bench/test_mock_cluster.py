"""``bench.mock_cluster``: librdkafka's mock cluster, its topics created through
librdkafka's C API with any partition count (the mock answers no CreateTopics)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from bench.mock_cluster import MockCluster


@pytest.fixture
def cluster() -> Iterator[MockCluster]:
    c = MockCluster()
    try:
        yield c
    finally:
        c.close()


def test_a_topic_gets_the_partitions_asked_for(cluster: MockCluster) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    cluster.create_topic("seven", 7)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 3})
    assert len(admin.list_topics("seven", timeout=30).topics["seven"].partitions) == 7
    delivered: list[tuple[int | None, int | None]] = []

    def report(err: object, msg: Any) -> None:
        assert err is None, err
        delivered.append((msg.partition(), msg.offset()))

    producer = Producer({"bootstrap.servers": cluster.bootstrap, "log_level": 3})
    producer.produce("seven", b"v", partition=6, on_delivery=report)
    assert producer.flush(30) == 0
    assert delivered == [(6, 0)]


def test_an_existing_topic_is_refused_with_librdkafkas_reason(cluster: MockCluster) -> None:
    cluster.create_topic("once", 2)
    with pytest.raises(RuntimeError, match="creating once: .*already exists"):
        cluster.create_topic("once", 3)
