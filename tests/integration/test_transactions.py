"""Transactions with confluent-kafka (librdkafka) against a real broker over TCP
(docs/architecture.md, "Transactions"): commit and abort across several partitions,
``send_offsets_to_transaction``, read_committed against read_uncommitted, a zombie
producer fenced by a newer instance, and the coordinator's timeout abort."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.broker import BrokerProcess, start_broker
from tests.integration.conftest import TIMEOUT, create_topic, unique_topic

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def txn_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = start_broker(tmp_path_factory.mktemp("txn-broker"))
    try:
        yield b
    finally:
        b.stop()


def txn_producer(bootstrap: str, txn_id: str, **conf: Any) -> Any:
    from confluent_kafka import Producer

    p = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5, **conf}
    )
    p.init_transactions(TIMEOUT)
    return p


def consume_all(
    bootstrap: str, topic: str, partitions: int, isolation: str, expect: int
) -> list[tuple[int, int, bytes]]:
    """Every record of ``topic`` from the start under ``isolation``: waits until ``expect``
    records arrived, then reads on until the end offsets are reached."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:6]}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + TIMEOUT
        idle = 0
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                idle += 1
                if len(got) >= expect and idle >= 4:
                    break
                continue
            idle = 0
            assert msg.error() is None, msg.error()
            part, off, val = msg.partition(), msg.offset(), msg.value()
            assert part is not None and off is not None and val is not None
            got.append((part, off, val))
        return sorted(got)
    finally:
        c.close()


def produce_txn(p: Any, topic: str, partitions: int, tag: str, n: int) -> None:
    p.begin_transaction()
    for i in range(n):
        p.produce(topic, value=f"{tag}-{i}".encode(), partition=i % partitions)
    p.flush(TIMEOUT)


def values(recs: list[tuple[int, int, bytes]]) -> set[bytes]:
    return {v for _, _, v in recs}


def test_commit_abort_and_isolation(txn_broker: BrokerProcess) -> None:
    bootstrap = txn_broker.bootstrap
    topic = unique_topic("txn")
    create_topic(bootstrap, topic, 3)
    p = txn_producer(bootstrap, f"tx-{uuid.uuid4().hex[:6]}")
    produce_txn(p, topic, 3, "c1", 30)
    p.commit_transaction(TIMEOUT)
    produce_txn(p, topic, 3, "a1", 30)
    p.abort_transaction(TIMEOUT)
    produce_txn(p, topic, 3, "c2", 30)
    p.commit_transaction(TIMEOUT)

    committed = {f"c{t}-{i}".encode() for t in (1, 2) for i in range(30)}
    aborted = {f"a1-{i}".encode() for i in range(30)}
    rc = consume_all(bootstrap, topic, 3, "read_committed", 60)
    assert values(rc) == committed and len(rc) == 60
    ru = consume_all(bootstrap, topic, 3, "read_uncommitted", 90)
    assert values(ru) == committed | aborted and len(ru) == 90
    # the markers take offsets: the committed records are not contiguous
    assert max(o for _, o, _ in rc) >= 20


def txn_start_offset(bootstrap: str, topic: str) -> int:
    """The current transaction start offset DescribeProducers gives for partition 0's one
    producer (kafka-python's admin client)."""
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KTP

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        (active,) = admin.describe_producers([KTP(topic, 0)])[KTP(topic, 0)].active_producers
        return int(active.current_transaction_start_offset)
    finally:
        admin.close()


def latest_offsets(bootstrap: str, topic: str) -> Any:
    """``latest(level)``: partition 0's latest offset under an isolation level
    (confluent-kafka's admin ListOffsets)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    admin = AdminClient({"bootstrap.servers": bootstrap})
    tp = TopicPartition(topic, 0)

    def latest(level: Any) -> int:
        fut = admin.list_offsets({tp: OffsetSpec.latest()}, isolation_level=level)
        return int(fut[tp].result(TIMEOUT).offset)

    return latest


def test_open_transaction_holds_read_committed(txn_broker: BrokerProcess) -> None:
    from confluent_kafka import IsolationLevel

    bootstrap = txn_broker.bootstrap
    topic = unique_topic("txn-open")
    create_topic(bootstrap, topic, 1)
    p = txn_producer(bootstrap, f"tx-{uuid.uuid4().hex[:6]}")
    produce_txn(p, topic, 1, "open", 10)  # flushed, not committed
    latest = latest_offsets(bootstrap, topic)
    assert latest(IsolationLevel.READ_UNCOMMITTED) == 10
    assert latest(IsolationLevel.READ_COMMITTED) == 0
    assert consume_all(bootstrap, topic, 1, "read_committed", 0) == []
    assert txn_start_offset(bootstrap, topic) == 0  # DescribeProducers: the open transaction
    p.commit_transaction(TIMEOUT)
    assert latest(IsolationLevel.READ_COMMITTED) == 11  # 10 records + the commit marker
    assert txn_start_offset(bootstrap, topic) == -1
    assert len(consume_all(bootstrap, topic, 1, "read_committed", 10)) == 10


def test_admin_aborts_a_hanging_transaction(txn_broker: BrokerProcess) -> None:
    """KIP-664 (``kafka-transactions.sh abort``): kafka-python's admin finds the open
    transaction with DescribeProducers and aborts it with WriteTxnMarkers; read_committed
    readers move past it and never see its records, and a later transaction commits."""
    from confluent_kafka import IsolationLevel
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KTP
    from kafka.admin import AbortTransactionSpec

    bootstrap = txn_broker.bootstrap
    topic = unique_topic("txn-hang")
    create_topic(bootstrap, topic, 1)
    p = txn_producer(bootstrap, f"tx-{uuid.uuid4().hex[:6]}")
    produce_txn(p, topic, 1, "hang", 10)  # flushed, never ended by its producer
    latest = latest_offsets(bootstrap, topic)
    assert latest(IsolationLevel.READ_COMMITTED) == 0
    kadmin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        state = kadmin.describe_producers([KTP(topic, 0)])[KTP(topic, 0)]
        (active,) = state.active_producers
        spec = AbortTransactionSpec(
            topic_partition=KTP(topic, 0),
            producer_id=active.producer_id,
            producer_epoch=active.producer_epoch,
            coordinator_epoch=active.coordinator_epoch,
        )
        kadmin.abort_transaction(spec)
        kadmin.abort_transaction(spec)  # again: nothing open, nothing written
    finally:
        kadmin.close()
    assert latest(IsolationLevel.READ_COMMITTED) == 11  # 10 records + the abort marker
    assert latest(IsolationLevel.READ_UNCOMMITTED) == 11
    assert consume_all(bootstrap, topic, 1, "read_committed", 0) == []
    assert txn_start_offset(bootstrap, topic) == -1
    fresh = txn_producer(bootstrap, f"tx-{uuid.uuid4().hex[:6]}")
    produce_txn(fresh, topic, 1, "after", 5)
    fresh.commit_transaction(TIMEOUT)
    assert values(consume_all(bootstrap, topic, 1, "read_committed", 5)) == {
        f"after-{i}".encode() for i in range(5)
    }
    del p  # its transaction times out at its coordinator; the partition has nothing open


def test_send_offsets_visible_on_commit_only(txn_broker: BrokerProcess) -> None:
    from confluent_kafka import Consumer, TopicPartition

    bootstrap = txn_broker.bootstrap
    topic = unique_topic("txn-offsets")
    create_topic(bootstrap, topic, 2)
    group = f"eos-{uuid.uuid4().hex[:6]}"
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        p = txn_producer(bootstrap, f"tx-{uuid.uuid4().hex[:6]}")
        meta = c.consumer_group_metadata()
        parts = [TopicPartition(topic, 0), TopicPartition(topic, 1)]

        def committed() -> list[int]:
            return [tp.offset for tp in c.committed(parts, TIMEOUT)]

        produce_txn(p, topic, 2, "x", 4)
        p.send_offsets_to_transaction(
            [TopicPartition(topic, 0, 7), TopicPartition(topic, 1, 9)], meta, TIMEOUT
        )
        assert committed() == [-1001, -1001]  # pending: not visible to the group
        p.abort_transaction(TIMEOUT)
        assert committed() == [-1001, -1001]
        produce_txn(p, topic, 2, "y", 4)
        p.send_offsets_to_transaction(
            [TopicPartition(topic, 0, 3), TopicPartition(topic, 1, 5)], meta, TIMEOUT
        )
        p.commit_transaction(TIMEOUT)
        assert committed() == [3, 5]
    finally:
        c.close()


def test_send_offsets_of_a_group_member(txn_broker: BrokerProcess) -> None:
    """Consume-transform-produce as an application runs it: the consumer's group metadata
    (member id, generation) goes with the offsets and is checked (KIP-447)."""
    from confluent_kafka import Consumer, TopicPartition

    bootstrap = txn_broker.bootstrap
    src, dst = unique_topic("txn-ctp-in"), unique_topic("txn-ctp-out")
    create_topic(bootstrap, src, 1)
    create_topic(bootstrap, dst, 1)
    seed = txn_producer(bootstrap, f"seed-{uuid.uuid4().hex[:6]}")
    produce_txn(seed, src, 1, "in", 10)
    seed.commit_transaction(TIMEOUT)
    group = f"ctp-{uuid.uuid4().hex[:6]}"
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    try:
        c.subscribe([src])
        got: list[Any] = []
        deadline = time.monotonic() + TIMEOUT
        while len(got) < 10 and time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(msg)
        assert len(got) == 10
        p = txn_producer(bootstrap, f"ctp-{uuid.uuid4().hex[:6]}")
        p.begin_transaction()
        for m in got:
            p.produce(dst, m.value().upper(), partition=0)
        meta = c.consumer_group_metadata()  # a real member id and generation
        p.send_offsets_to_transaction([TopicPartition(src, 0, got[-1].offset() + 1)], meta, TIMEOUT)
        p.commit_transaction(TIMEOUT)
        (tp,) = c.committed([TopicPartition(src, 0)], TIMEOUT)
        assert tp.offset == got[-1].offset() + 1
    finally:
        c.close()
    out = consume_all(bootstrap, dst, 1, "read_committed", 10)
    assert values(out) == {f"IN-{i}".encode() for i in range(10)}


def test_zombie_fenced_by_new_instance(txn_broker: BrokerProcess) -> None:
    from confluent_kafka import KafkaException

    bootstrap = txn_broker.bootstrap
    topic = unique_topic("txn-zombie")
    create_topic(bootstrap, topic, 2)
    txn_id = f"tx-{uuid.uuid4().hex[:6]}"
    zombie = txn_producer(bootstrap, txn_id)
    produce_txn(zombie, topic, 2, "zombie", 6)  # open, flushed
    fresh = txn_producer(bootstrap, txn_id)  # fences the zombie, aborts its transaction
    produce_txn(fresh, topic, 2, "fresh", 6)
    fresh.commit_transaction(TIMEOUT)
    with pytest.raises(KafkaException) as info:
        zombie.produce(topic, value=b"late", partition=0)
        zombie.flush(TIMEOUT)
        zombie.commit_transaction(TIMEOUT)
    err = info.value.args[0]
    assert err.fatal() or "fenced" in str(err).lower(), err
    rc = consume_all(bootstrap, topic, 2, "read_committed", 6)
    assert values(rc) == {f"fresh-{i}".encode() for i in range(6)}
    ru = consume_all(bootstrap, topic, 2, "read_uncommitted", 12)
    assert b"late" not in values(ru)  # refused: the partition never took it


def test_coordinator_aborts_timed_out_transaction(txn_broker: BrokerProcess) -> None:
    bootstrap = txn_broker.bootstrap
    topic = unique_topic("txn-timeout")
    create_topic(bootstrap, topic, 1)
    p = txn_producer(bootstrap, f"tx-{uuid.uuid4().hex[:6]}", **{"transaction.timeout.ms": 2000})
    produce_txn(p, topic, 1, "slow", 5)
    # the coordinator aborts it: the records become visible to read_committed as aborted
    deadline = time.monotonic() + TIMEOUT
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    admin = AdminClient({"bootstrap.servers": bootstrap})
    tp = TopicPartition(topic, 0)
    lso = 0
    while time.monotonic() < deadline and lso < 6:
        fut = admin.list_offsets(
            {tp: OffsetSpec.latest()}, isolation_level=IsolationLevel.READ_COMMITTED
        )
        lso = int(fut[tp].result(TIMEOUT).offset)
        time.sleep(0.2)
    assert lso == 6  # 5 records + the abort marker
    assert consume_all(bootstrap, topic, 1, "read_committed", 0) == []
    assert len(consume_all(bootstrap, topic, 1, "read_uncommitted", 5)) == 5


def test_concurrent_transactional_producers(txn_broker: BrokerProcess) -> None:
    """Eight producers interleave transactions on the same partitions (every third one
    aborted): read_committed sees exactly the committed records, once each."""
    import threading

    bootstrap = txn_broker.bootstrap
    topic = unique_topic("txn-many")
    create_topic(bootstrap, topic, 4)
    errors: list[str] = []

    def worker(w: int) -> None:
        try:
            p = txn_producer(bootstrap, f"many-{w}-{uuid.uuid4().hex[:4]}")
            for t in range(12):
                produce_txn_offset(p, topic, w, t)
                if t % 3 == 2:
                    p.abort_transaction(TIMEOUT)
                else:
                    p.commit_transaction(TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors
    want = {
        f"{w}-{t}-{i}".encode()
        for w in range(8)
        for t in range(12)
        if t % 3 != 2
        for i in range(10)
    }
    got = consume_all(bootstrap, topic, 4, "read_committed", len(want))
    assert len(got) == len(want) and values(got) == want
    assert len(consume_all(bootstrap, topic, 4, "read_uncommitted", 8 * 12 * 10)) == 8 * 12 * 10


def produce_txn_offset(p: Any, topic: str, w: int, t: int) -> None:
    p.begin_transaction()
    for i in range(10):
        p.produce(topic, f"{w}-{t}-{i}".encode(), partition=(w + i) % 4)
    p.flush(TIMEOUT)


def test_zz_logs_clean(txn_broker: BrokerProcess, tmp_path: Path) -> None:
    text = txn_broker.log_text()
    assert "Traceback" not in text, text[-4000:]
