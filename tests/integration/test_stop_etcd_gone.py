"""A broker asked to stop while etcd does not answer (docs/operations.md, "Stopping a
broker"): a real etcd frozen with SIGSTOP, a real broker process stopped with SIGTERM.

Before, the stop flushed cycle after cycle, each commit waiting out its resolution, then
released every partition one after another, each release waiting out etcd's request
timeout: minutes for a few dozen partitions, past any pod's grace period. Now the stop
gives up flushing and releasing once the lease is in doubt, so it ends within about a
lease TTL. Nothing acknowledged may be lost on the way: once etcd answers again, a new
broker serves every acknowledged record at the offset its delivery report gave.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.fixtures.broker import BrokerProcess, free_port, start_broker
from tests.fixtures.etcd import EtcdProcess, start_etcd
from tests.integration.deliveries import acked_at, missing

pytestmark = pytest.mark.integration

PARTITIONS = 64
LEASE_TTL_S = 6
#: far above a stop bounded by the lease (about LEASE_TTL_S), far below the stop before
#: (etcd's 5 s request timeout per partition released: over 300 s for 64 partitions)
STOP_DEADLINE_S = 150


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    (tmp_path / "etcd").mkdir()
    proc = start_etcd(tmp_path / "etcd")
    try:
        yield proc
    finally:
        os.kill(proc.pid, signal.SIGCONT)  # a stopped process ignores SIGTERM until then
        proc.stop()


def _broker(tmp_path: Path, etcd: EtcdProcess, node_id: int, port: int) -> BrokerProcess:
    return start_broker(
        tmp_path / f"b{node_id}",
        store_url=f"file://{tmp_path / 'data'}",
        meta_url=etcd.url,
        node_id=node_id,
        port=port,
        extra_args=("--lease-ttl", str(LEASE_TTL_S)),
    )


def _produce(
    bootstrap: str, topic: str, tag: str, n: int, acked: dict[bytes, tuple[int, int]]
) -> Producer:
    def report(err: object, msg: Message) -> None:
        value = msg.value()
        if err is None and value is not None:
            acked[value] = acked_at(msg)

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                  "message.timeout.ms": 300_000, "log_level": 2})  # fmt: skip
    for i in range(n):
        p.produce(topic, f"{tag}-{i}".encode(), partition=i % PARTITIONS, on_delivery=report)
    p.poll(0)
    return p


def _read_all(bootstrap: str, topic: str) -> dict[bytes, tuple[int, int]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "log_level": 2})  # fmt: skip
    try:
        ends = {}
        for p in range(PARTITIONS):
            ends[p] = c.get_watermark_offsets(TopicPartition(topic, p), timeout=60)[1]
        c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS) if ends[p] > 0])
        found: dict[bytes, tuple[int, int]] = {}
        left = {p for p, end in ends.items() if end > 0}
        while left:
            msg = c.poll(60)
            assert msg is not None, f"partitions {sorted(left)} did not read to their end"
            assert msg.error() is None, msg.error()
            value, part, offset = msg.value(), msg.partition(), msg.offset()
            assert value is not None and part is not None and offset is not None
            found[value] = (part, offset)
            if offset + 1 >= ends[part]:
                left.discard(part)
        return found
    finally:
        c.close()


def test_a_stop_with_etcd_frozen_ends_within_the_lease_and_loses_nothing(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    ports = free_port(), free_port()
    first = _broker(tmp_path, etcd, 1, ports[0])
    # the producers know both addresses: the second broker, started later, is where
    # their retries go once the first has stopped
    both = ",".join(f"127.0.0.1:{p}" for p in ports)
    topic = "stop-etcd-gone"
    admin = AdminClient({"bootstrap.servers": first.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS)])[topic].result(30)
    acked: dict[bytes, tuple[int, int]] = {}
    p1 = _produce(both, topic, "before", 20 * PARTITIONS, acked)
    assert p1.flush(120) == 0
    assert len(acked) == 20 * PARTITIONS  # every partition owned, with committed data

    os.kill(etcd.pid, signal.SIGSTOP)
    # records still buffered or in flight when the stop begins: none can be acknowledged
    # while etcd is frozen, and none of them may poison a partition either
    p2 = _produce(both, topic, "during", 4 * PARTITIONS, acked)
    p2.flush(1)
    assert first.proc is not None
    first.proc.send_signal(signal.SIGTERM)
    try:
        rc = first.proc.wait(STOP_DEADLINE_S)
    except subprocess.TimeoutExpired:
        first.kill9()
        pytest.fail(f"the stop did not end within {STOP_DEADLINE_S} s with etcd frozen")
    log_text = first.log_text()
    assert rc == 0, log_text[-3000:]
    assert "Traceback" not in log_text, log_text[-3000:]
    assert "the lease is in doubt" in log_text  # it gave up, rather than ending by luck

    os.kill(etcd.pid, signal.SIGCONT)
    second = _broker(tmp_path, etcd, 2, ports[1])
    try:
        assert p2.flush(240) == 0  # the producer's retries reach the new owner
        found = _read_all(second.bootstrap, topic)
    finally:
        second.stop()
    assert not missing(acked, found)
    assert len(found) == len(set(found))
    assert all(f"during-{i}".encode() in found for i in range(4 * PARTITIONS))
