"""Transaction APIs on the wire (kafka-python's codec over TCP against a real broker):
Kafka's error codes where Kafka gives them, and bad input leaving the partition
unchanged (docs/architecture.md, "Transactions")."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from kafka.protocol.admin.transactions import (
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
)
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.protocol.producer.transaction import (
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
)

from protocol.errors import ErrorCode as E
from protocol.records import build_batch
from tests.fixtures.broker import BrokerProcess
from tests.integration import kafka_raw as kr
from tests.integration.conftest import create_topic, unique_topic
from tests.integration.kafka_raw import RawConn
from tests.integration.test_transactions import txn_broker  # noqa: F401

pytestmark = pytest.mark.integration


def init(c: RawConn, tid: str, timeout_ms: int = 60_000, pid: int = -1, epoch: int = -1) -> Any:
    req = InitProducerIdRequest(
        transactional_id=tid,
        transaction_timeout_ms=timeout_ms,
        producer_id=pid,
        producer_epoch=epoch,
    )
    return c.call(req, InitProducerIdResponse, 4)


def add(c: RawConn, tid: str, pid: int, epoch: int, topics: list[tuple[str, list[int]]]) -> Any:
    req = AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=tid,
        v3_and_below_producer_id=pid,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=[(t, ps) for t, ps in topics],
    )
    res = c.call(req, AddPartitionsToTxnResponse, 3)
    return {
        (t.name, p.partition_index): p.partition_error_code
        for t in res.results_by_topic_v3_and_below
        for p in t.results_by_partition
    }


def end(c: RawConn, tid: str, pid: int, epoch: int, commit: bool) -> int:
    req = EndTxnRequest(
        transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=commit
    )
    return int(c.call(req, EndTxnResponse, 3).error_code)


def produce(c: RawConn, tid: str | None, topic: str, batch: bytes) -> tuple[int, int]:
    req = ProduceRequest(
        transactional_id=tid, acks=-1, timeout_ms=10_000, topic_data=[(topic, [(0, batch)])]
    )
    res = c.call(req, ProduceResponse, 8)
    p = res.responses[0].partition_responses[0]
    return int(p.error_code), int(p.base_offset)


def txn_batch(pid: int, epoch: int, seq: int, *, control: bool = False) -> bytes:
    return build_batch(
        [(b"k", b"v", None)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        transactional=True,
        control=control,
    )


def fetch(c: RawConn, topic: str, isolation: int) -> Any:
    req = kr.fetch_request(
        [(topic, [(0, -1, 0, -1, 1 << 20)])], max_bytes=1 << 20, isolation_level=isolation
    )
    return c.call(req, FetchResponse, 11).responses[0].partitions[0]


def describe(c: RawConn, tid: str) -> Any:
    req = DescribeTransactionsRequest(transactional_ids=[tid])
    return c.call(req, DescribeTransactionsResponse, 0).transaction_states[0]


def test_errors_and_bad_input(txn_broker: BrokerProcess) -> None:  # noqa: F811
    topic = unique_topic("txn-wire")
    create_topic(txn_broker.bootstrap, topic, 1)
    tid = f"wire-{uuid.uuid4().hex[:6]}"
    with RawConn(txn_broker.port) as c:
        assert init(c, tid, 10**9).error_code == E.INVALID_TRANSACTION_TIMEOUT
        assert describe(c, tid).error_code == E.TRANSACTIONAL_ID_NOT_FOUND
        first = init(c, tid)
        assert first.error_code == 0 and first.producer_epoch == 0
        pid = first.producer_id
        assert end(c, tid, pid, 0, True) == E.INVALID_TXN_STATE  # nothing to end
        # a batch of a transaction that does not include the partition is refused
        assert produce(c, tid, topic, txn_batch(pid, 0, 0))[0] == E.INVALID_TXN_STATE
        got = add(c, tid, pid, 0, [(topic, [0]), ("no-such-topic-x", [0])])
        assert got == {
            (topic, 0): E.OPERATION_NOT_ATTEMPTED,
            ("no-such-topic-x", 0): E.UNKNOWN_TOPIC_OR_PARTITION,
        }
        assert add(c, tid, pid, 0, [(topic, [0])]) == {(topic, 0): 0}
        assert add(c, tid, pid + 1, 0, [(topic, [0])]) == {
            (topic, 0): E.INVALID_PRODUCER_ID_MAPPING
        }
        assert produce(c, tid, topic, txn_batch(pid, 0, 0)) == (0, 0)
        # a client's forged marker: refused, the partition unchanged
        assert produce(c, tid, topic, txn_batch(pid, 0, 1, control=True))[0] == E.INVALID_RECORD
        part = fetch(c, topic, 1)
        assert (part.high_watermark, part.last_stable_offset) == (1, 0)
        assert not part.records  # read_committed stops at the open transaction
        assert fetch(c, topic, 0).records  # read_uncommitted sees it

        d = describe(c, tid)
        assert (d.error_code, d.transaction_state, d.producer_id) == (0, "Ongoing", pid)
        assert [(t.topic, list(t.partitions)) for t in d.topics] == [(topic, [0])]
        listed = c.call(
            ListTransactionsRequest(state_filters=["Ongoing", "Bogus"], producer_id_filters=[]),
            ListTransactionsResponse,
            0,
        )
        assert list(listed.unknown_state_filters) == ["Bogus"]
        assert tid in {t.transactional_id for t in listed.transaction_states}

        # a new instance: the ongoing transaction is aborted at a bumped epoch
        deadline = time.monotonic() + 20
        new = init(c, tid)
        while new.error_code == E.CONCURRENT_TRANSACTIONS and time.monotonic() < deadline:
            time.sleep(0.2)
            new = init(c, tid)
        assert new.error_code == 0 and new.producer_id == pid and new.producer_epoch == 2
        # the old instance is fenced at the coordinator and on the partition
        assert end(c, tid, pid, 0, True) == E.PRODUCER_FENCED
        assert produce(c, tid, topic, txn_batch(pid, 0, 1))[0] == E.INVALID_PRODUCER_EPOCH
        part = fetch(c, topic, 1)
        assert (part.high_watermark, part.last_stable_offset) == (2, 2)  # data + abort marker
        assert [(a.producer_id, a.first_offset) for a in part.aborted_transactions] == [(pid, 0)]
        assert describe(c, tid).transaction_state == "Empty"
        # KIP-360: the producer names its id and epoch; a lost answer's retry gets the same
        bumped = init(c, tid, pid=pid, epoch=2)
        assert (bumped.error_code, bumped.producer_id, bumped.producer_epoch) == (0, pid, 3)
        again = init(c, tid, pid=pid, epoch=2)
        assert (again.error_code, again.producer_epoch) == (0, 3)
        assert init(c, tid, pid=pid, epoch=0).error_code == E.PRODUCER_FENCED


def test_aborted_index_dropped_below_log_start(txn_broker: BrokerProcess) -> None:  # noqa: F811
    import asyncio

    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    from broker.meta.base import open_meta
    from broker.meta.schema import partition_txn_prefix

    topic = unique_topic("txn-prune")
    create_topic(txn_broker.bootstrap, topic, 1)
    tid = f"prune-{uuid.uuid4().hex[:6]}"

    def aborted_keys() -> list[str]:
        async def read() -> list[str]:
            meta = open_meta("embedded", data_dir=str(txn_broker.workdir / "data"), read_only=True)
            try:
                return [kv.key for kv in await meta.range(partition_txn_prefix(topic, 0))]
            finally:
                await meta.close()

        return asyncio.run(read())

    with RawConn(txn_broker.port) as c:
        r = init(c, tid)
        pid = r.producer_id
        assert add(c, tid, pid, 0, [(topic, [0])]) == {(topic, 0): 0}
        assert produce(c, tid, topic, txn_batch(pid, 0, 0)) == (0, 0)
        assert end(c, tid, pid, 0, False) == 0  # aborted: marker at offset 1
        assert produce(c, None, topic, build_batch([(b"k", b"plain", None)])) == (0, 2)
        part = fetch(c, topic, 1)
        assert [(a.producer_id, a.first_offset) for a in part.aborted_transactions] == [(pid, 0)]
    assert len(aborted_keys()) == 1
    admin = AdminClient({"bootstrap.servers": txn_broker.bootstrap})
    futs = admin.delete_records([TopicPartition(topic, 0, 2)])
    for f in futs.values():
        f.result(20)
    deadline = time.monotonic() + 20
    while aborted_keys() and time.monotonic() < deadline:  # the owner's next scan
        time.sleep(0.3)
    assert aborted_keys() == []


def test_txn_offset_commit_checks_the_member(txn_broker: BrokerProcess) -> None:  # noqa: F811
    from kafka.protocol.producer.transaction import (
        AddOffsetsToTxnRequest,
        AddOffsetsToTxnResponse,
        TxnOffsetCommitRequest,
        TxnOffsetCommitResponse,
    )

    topic = unique_topic("txn-member")
    create_topic(txn_broker.bootstrap, topic, 1)
    tid, group = f"member-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    with RawConn(txn_broker.port) as c:
        r = init(c, tid)
        pid = r.producer_id
        req = AddOffsetsToTxnRequest(
            transactional_id=tid, producer_id=pid, producer_epoch=0, group_id=group
        )
        assert c.call(req, AddOffsetsToTxnResponse, 3).error_code == 0

        def commit(generation: int, member: str) -> int:
            req = TxnOffsetCommitRequest(
                transactional_id=tid,
                group_id=group,
                producer_id=pid,
                producer_epoch=0,
                generation_id=generation,
                member_id=member,
                group_instance_id=None,
                topics=[(topic, [(0, 5, -1, "")])],
            )
            res = c.call(req, TxnOffsetCommitResponse, 3)
            return int(res.topics[0].partitions[0].error_code)

        assert commit(4, "ghost") == E.ILLEGAL_GENERATION  # no such group generation
        assert commit(-1, "") == 0  # a producer without consumer metadata: not checked
        assert end(c, tid, pid, 0, True) == 0
