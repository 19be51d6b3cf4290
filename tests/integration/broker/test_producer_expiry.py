"""Producer id expiration (Kafka's ``producer.id.expiration.ms``, ``broker.maintenance``):
an idempotent producer that has not written to a partition for
``--producer-id-expiration-ms`` is forgotten there, so a partition's producer state
(memory, and its persisted snapshot) no longer grows with every producer that ever wrote
to it. A producer with a transaction open on the partition is kept, as Kafka keeps it.
A forgotten producer is accepted at any sequence again, as Kafka accepts one.

In-process brokers over a real local-directory store and a real metadata store (the
embedded one, and a real etcd process) with a raw TCP client and confluent-kafka's
transactional producer, whose state kafka-python's admin client reads back with
DescribeProducers; and a broker process whose flags turn expiry on."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from broker.config import BrokerConfig
from broker.server import Broker
from protocol.errors import ErrorCode
from tests.fixtures.broker import free_port, start_broker
from tests.fixtures.inprocess import meta_config
from tests.integration.broker.test_flush_pipeline import TOPIC
from tests.integration.broker.test_idempotent_failures import PID, Pipelined
from tests.integration.broker.test_producer_snapshot_faults import stored
from tests.integration.conftest import create_topic, unique_topic
from tests.integration.test_transactions import TIMEOUT, produce_txn, txn_producer

DAY_MS = 86_400_000


@pytest.fixture(params=["embedded", "etcd"])
def cfg(request: pytest.FixtureRequest, tmp_path: Path) -> BrokerConfig:
    # the maintenance loop never comes round by itself: the tests run its passes; real
    # clients follow the advertised port
    port = free_port()
    return meta_config(
        request,
        tmp_path,
        listen_port=port,
        advertised_port=port,
        retention_check_interval_ms=10**9,
        producer_id_expiration_check_interval_ms=10**9,
    )


def describe(bootstrap: str, topic: str) -> dict[int, Any]:
    """Partition 0's producers by id (DescribeProducers, kafka-python's admin client)."""
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KTP

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        state = admin.describe_producers([KTP(topic, 0)])[KTP(topic, 0)]
        return {p.producer_id: p for p in state.active_producers}
    finally:
        admin.close()


def now_ms() -> int:
    return int(time.time() * 1000)


async def test_an_idle_producer_expires_and_one_with_an_open_transaction_stays(
    cfg: BrokerConfig,
) -> None:
    b = Broker(cfg)
    await b.start()
    bootstrap = f"127.0.0.1:{b.port}"
    started = now_ms()
    txn: Any = None
    try:
        await b.topics.create(TOPIC, 1)
        conn = await Pipelined.open(b)
        assert await conn.answer(conn.send(0, "a")) == (ErrorCode.NONE, 0)  # sequences 0-1
        txn = await asyncio.to_thread(txn_producer, bootstrap, f"tx-{uuid.uuid4().hex[:6]}")
        await asyncio.to_thread(produce_txn, txn, TOPIC, 1, "t", 3)  # open at offset 2
        seen = await asyncio.to_thread(describe, bootstrap, TOPIC)
        assert set(seen) > {PID} and len(seen) == 2
        (tpid,) = set(seen) - {PID}
        assert started <= seen[PID].last_timestamp <= now_ms()  # when it last wrote
        maintenance = b.logs.maintenance
        assert maintenance is not None
        await maintenance.run_once(expire_at_ms=now_ms())  # idle for less than a day
        assert set(await asyncio.to_thread(describe, bootstrap, TOPIC)) == {PID, tpid}
        snap = await stored(b, TOPIC)
        assert snap is not None and {p[0] for p in snap.producers} == {PID, tpid}

        await maintenance.run_once(expire_at_ms=now_ms() + DAY_MS + 60_000)  # a day later
        after = await asyncio.to_thread(describe, bootstrap, TOPIC)
        assert set(after) == {tpid}  # the transaction keeps its producer
        assert after[tpid].current_transaction_start_offset == 2
        assert maintenance.stats["expired_producers"] == 1
        snap = await stored(b, TOPIC)  # rewritten without the expired producer
        assert snap is not None and [p[0] for p in snap.producers] == [tpid]
        await asyncio.to_thread(txn.commit_transaction, TIMEOUT)
        lg = await b.logs.get(TOPIC, 0)
        assert lg.txns is not None and tpid in lg.txns.fenced  # the commit marker's epoch
        await maintenance.run_once(expire_at_ms=now_ms() + DAY_MS + 60_000)
        assert await asyncio.to_thread(describe, bootstrap, TOPIC) == {}  # ended: it goes
        assert tpid not in lg.txns.fenced and tpid not in lg.txns.closed
        assert maintenance.stats["expired_producers"] == 2
        await conn.close()
    finally:
        if txn is not None:
            await asyncio.to_thread(txn.flush, TIMEOUT)
        await b.stop()
    node = Broker(cfg)  # the next owner: the hand-off's snapshot brings neither back
    await node.start()
    bootstrap = f"127.0.0.1:{node.port}"
    conn = await Pipelined.open(node)
    try:
        lg = await node.logs.get(TOPIC, 0)
        end = lg.hw  # 2 records of PID, 3 of the transaction and its commit marker
        assert end == 6
        assert await asyncio.to_thread(describe, bootstrap, TOPIC) == {}
        # forgotten, it is accepted at any sequence (Kafka does the same)
        assert await conn.answer(conn.send(10, "late")) == (ErrorCode.NONE, end)
        assert (await conn.answer(conn.send(14, "gap")))[0] == (
            ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER  # and tracked again from there
        )
    finally:
        await conn.close()
        await node.stop()


def test_the_flags_turn_expiry_on_in_a_broker_process(tmp_path: Path) -> None:
    """``--producer-id-expiration-ms`` and its check interval reach the maintenance loop:
    the producer of a real client is forgotten once idle, without any request."""
    from confluent_kafka import Producer

    proc = start_broker(
        tmp_path,
        extra_args=(
            "--producer-id-expiration-ms",
            "1",
            "--producer-id-expiration-check-interval-ms",
            "200",
        ),
    )
    try:
        topic = unique_topic("expiry")
        create_topic(proc.bootstrap, topic, 1)
        p = Producer({"bootstrap.servers": proc.bootstrap, "enable.idempotence": True})
        for i in range(5):
            p.produce(topic, value=b"v%d" % i, partition=0)
        assert p.flush(TIMEOUT) == 0
        deadline = time.monotonic() + 120
        while describe(proc.bootstrap, topic):  # expired by a pass of the loop
            assert time.monotonic() < deadline, "the idle producer was never forgotten"
            time.sleep(0.2)  # polls the broker's answer, not a timing assumption
        # a later write of the same producer (sequence 5) is accepted
        assert "--producer-id-expiration-ms 1 is below" in proc.log_text()  # warned at start
        acks: list[tuple[Any, Any]] = []
        p.produce(
            topic,
            value=b"after",
            partition=0,
            on_delivery=lambda e, m: acks.append((e, m.offset())),
        )
        assert p.flush(TIMEOUT) == 0
        assert acks == [(None, 5)]
    finally:
        proc.stop()
