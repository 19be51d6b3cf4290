"""The ACL matrix of the transaction APIs (docs/operations.md, "ACLs"), on the session's
secured broker: WRITE on the transactional id for InitProducerId, AddPartitionsToTxn,
AddOffsetsToTxn, EndTxn, TxnOffsetCommit and transactional Produce; DESCRIBE on it for
FindCoordinator (key type 1), DescribeTransactions and ListTransactions; WRITE on the
topics added, READ on the group and topics of offsets. ``txer`` holds the ACLs of its
own transactional id, topic and group; ``nobody`` holds DESCRIBE and WRITE on the topic
and READ on the group only. A real transactional confluent-kafka producer runs the
whole consume-transform-produce path as ``txer``."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AclOperation,
    AdminClient,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from kafka.protocol.admin.transactions import (
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
)
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.protocol.producer.transaction import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
)

from protocol.records import build_batch
from tests.integration.kafka_raw import RawConn
from tests.integration.security.conftest import SecureBroker
from tests.integration.security.raw_sasl import login
from tests.integration.security.test_acls import TIMEOUT, acl, add_acls, create_topics

pytestmark = pytest.mark.integration
OK, TOPIC_AUTHZ, GROUP_AUTHZ, TXN_AUTHZ, NOT_ATTEMPTED = 0, 29, 30, 53, 55


@dataclass
class Txw:
    sb: SecureBroker
    txn_id: str
    topic: str
    other_topic: str  # txer may not WRITE or READ it
    group: str
    users: dict[str, str]  # name -> password

    @property
    def txer(self) -> str:
        return next(u for u in self.users if u.startswith("txer"))

    @property
    def nobody(self) -> str:
        return next(u for u in self.users if u.startswith("nobody"))

    def call(self, user: str, req: Any, resp_cls: Any, version: int) -> Any:
        with RawConn(self.sb.ports["SASL_PLAINTEXT"]) as conn:
            login(conn, user, self.users[user], "SCRAM-SHA-512")
            return conn.call(req, resp_cls, version, 10)

    def producer(self, user: str, txn_id: str) -> Producer:
        return Producer(
            self.sb.confluent(
                "SASL_PLAINTEXT",
                user,
                "SCRAM-SHA-512",
                self.users[user],
                **{"transactional.id": txn_id, "transaction.timeout.ms": 60000},
            )
        )


@pytest.fixture(scope="module")
def txw(secure_broker: SecureBroker) -> Iterator[Txw]:
    tag = uuid.uuid4().hex[:8]
    admin = AdminClient(secure_broker.confluent("SASL_PLAINTEXT", "admin"))
    users = {f"txer{tag}": f"t-{tag}", f"nobody{tag}": f"n-{tag}"}
    ups = [
        UserScramCredentialUpsertion(
            u, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), pw.encode()
        )
        for u, pw in users.items()
    ]
    for fut in admin.alter_user_scram_credentials(list[Any](ups), request_timeout=TIMEOUT).values():
        fut.result(TIMEOUT)
    w = Txw(secure_broker, f"txid-{tag}", f"tx-{tag}", f"tx-other-{tag}", f"txg-{tag}", users)
    create_topics(admin, w.topic, w.other_topic)
    txer, nobody = f"User:{w.txer}", f"User:{w.nobody}"
    T, G, X = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID
    add_acls(
        admin,
        acl(X, w.txn_id, txer, AclOperation.WRITE),
        acl(T, w.topic, txer, AclOperation.WRITE),
        acl(T, w.topic, txer, AclOperation.READ),
        acl(G, w.group, txer, AclOperation.READ),
        acl(T, w.topic, nobody, AclOperation.WRITE),
        acl(T, w.topic, nobody, AclOperation.READ),
        acl(G, w.group, nobody, AclOperation.READ),
    )
    yield w


def test_transactional_producer_allowed_end_to_end(txw: Txw) -> None:
    p = txw.producer(txw.txer, txw.txn_id)
    p.init_transactions(TIMEOUT)
    p.begin_transaction()
    p.produce(txw.topic, b"in-txn")
    meta = Consumer(
        txw.sb.confluent(
            "SASL_PLAINTEXT",
            txw.txer,
            "SCRAM-SHA-512",
            txw.users[txw.txer],
            **{"group.id": txw.group},
        )
    )
    try:
        p.send_offsets_to_transaction(
            [TopicPartition(txw.topic, 0, 1)], meta.consumer_group_metadata(), TIMEOUT
        )
    finally:
        meta.close()
    p.commit_transaction(TIMEOUT)
    # FindCoordinator and DescribeTransactions: WRITE implies DESCRIBE on the id
    req = FindCoordinatorRequest(key=txw.txn_id, key_type=1)
    assert txw.call(txw.txer, req, FindCoordinatorResponse, 3).error_code == OK
    desc = DescribeTransactionsRequest(transactional_ids=[txw.txn_id])
    (st,) = txw.call(txw.txer, desc, DescribeTransactionsResponse, 0).transaction_states
    assert st.error_code == OK and st.transaction_state == "CompleteCommit"
    lst = ListTransactionsRequest(state_filters=[], producer_id_filters=[])
    ids = {
        s.transactional_id
        for s in txw.call(txw.txer, lst, ListTransactionsResponse, 0).transaction_states
    }
    assert txw.txn_id in ids


def test_init_without_write_on_the_id_is_refused(txw: Txw) -> None:
    p = txw.producer(txw.nobody, txw.txn_id)
    with pytest.raises(KafkaException) as err:
        p.init_transactions(TIMEOUT)
    assert err.value.args[0].code() == TXN_AUTHZ


def test_describe_list_and_find_need_describe_on_the_id(txw: Txw) -> None:
    deadline = time.monotonic() + TIMEOUT
    lst = ListTransactionsRequest(state_filters=[], producer_id_filters=[])
    while True:  # the first test's transaction exists
        ids = {
            s.transactional_id
            for s in txw.call(txw.txer, lst, ListTransactionsResponse, 0).transaction_states
        }
        if txw.txn_id in ids:
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)
    ids = {
        s.transactional_id
        for s in txw.call(txw.nobody, lst, ListTransactionsResponse, 0).transaction_states
    }
    assert txw.txn_id not in ids
    desc = DescribeTransactionsRequest(transactional_ids=[txw.txn_id])
    (st,) = txw.call(txw.nobody, desc, DescribeTransactionsResponse, 0).transaction_states
    assert st.error_code == TXN_AUTHZ
    req = FindCoordinatorRequest(key=txw.txn_id, key_type=1)
    assert txw.call(txw.nobody, req, FindCoordinatorResponse, 3).error_code == TXN_AUTHZ


def add_partitions(txw: Txw, user: str, topics: list[str]) -> dict[str, int]:
    t = AddPartitionsToTxnRequest.AddPartitionsToTxnTopic
    req = AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=txw.txn_id,
        v3_and_below_producer_id=1,
        v3_and_below_producer_epoch=0,
        v3_and_below_topics=[t(name=n, partitions=[0]) for n in topics],
    )
    resp = txw.call(user, req, AddPartitionsToTxnResponse, 3)
    return {
        r.name: r.results_by_partition[0].partition_error_code
        for r in resp.results_by_topic_v3_and_below
    }


def test_add_partitions_needs_write_on_id_and_topics(txw: Txw) -> None:
    got = add_partitions(txw, txw.nobody, [txw.topic])
    assert got == {txw.topic: TXN_AUTHZ}
    got = add_partitions(txw, txw.txer, [txw.topic, txw.other_topic])
    assert got == {txw.topic: NOT_ATTEMPTED, txw.other_topic: TOPIC_AUTHZ}


def test_add_offsets_end_txn_and_txn_offset_commit(txw: Txw) -> None:
    add = AddOffsetsToTxnRequest(
        transactional_id=txw.txn_id, producer_id=1, producer_epoch=0, group_id=txw.group
    )
    assert txw.call(txw.nobody, add, AddOffsetsToTxnResponse, 3).error_code == TXN_AUTHZ
    add_other = AddOffsetsToTxnRequest(
        transactional_id=txw.txn_id, producer_id=1, producer_epoch=0, group_id=f"{txw.group}-x"
    )
    assert txw.call(txw.txer, add_other, AddOffsetsToTxnResponse, 3).error_code == GROUP_AUTHZ
    end = EndTxnRequest(
        transactional_id=txw.txn_id, producer_id=1, producer_epoch=0, committed=False
    )
    assert txw.call(txw.nobody, end, EndTxnResponse, 3).error_code == TXN_AUTHZ

    def commit(user: str, group: str, topics: list[str]) -> dict[str, int]:
        t = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
        p = t.TxnOffsetCommitRequestPartition
        req = TxnOffsetCommitRequest(
            transactional_id=txw.txn_id,
            group_id=group,
            producer_id=1,
            producer_epoch=0,
            topics=[
                t(
                    name=n,
                    partitions=[
                        p(
                            partition_index=0,
                            committed_offset=1,
                            committed_leader_epoch=-1,
                            committed_metadata="",
                        )
                    ],
                )
                for n in topics
            ],
        )
        resp = txw.call(user, req, TxnOffsetCommitResponse, 2)
        return {r.name: r.partitions[0].error_code for r in resp.topics}

    assert commit(txw.nobody, txw.group, [txw.topic]) == {txw.topic: TXN_AUTHZ}
    assert commit(txw.txer, f"{txw.group}-x", [txw.topic]) == {txw.topic: GROUP_AUTHZ}
    got = commit(txw.txer, txw.group, [txw.topic, txw.other_topic])
    assert got[txw.other_topic] == TOPIC_AUTHZ and got[txw.topic] != TOPIC_AUTHZ


def test_transactional_produce_needs_write_on_the_id(txw: Txw) -> None:
    batch = build_batch(
        [(None, b"v", [])],
        base_timestamp=int(time.time() * 1000),
        producer_id=1,
        producer_epoch=0,
        base_sequence=0,
        transactional=True,
    )
    req = ProduceRequest(
        transactional_id=txw.txn_id,
        acks=-1,
        timeout_ms=10000,
        topic_data=[(txw.topic, [(0, batch)])],
    )
    resp = txw.call(txw.nobody, req, ProduceResponse, 8)
    codes = [p.error_code for t in resp.responses for p in t.partition_responses]
    assert codes == [TXN_AUTHZ]
