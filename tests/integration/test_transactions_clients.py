"""Transactions with aiokafka, kafka-python and kafkajs against a real broker over TCP:
commit, abort and offsets sent in a transaction; each client's read_committed consumer
sees the committed records only, a read_uncommitted one (librdkafka) sees all of them."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.fixtures.broker import BrokerProcess
from tests.integration.conftest import TIMEOUT, create_topic, unique_topic
from tests.integration.test_clients_kafkajs import kafkajs  # noqa: F401
from tests.integration.test_transactions import consume_all, txn_broker  # noqa: F401

pytestmark = pytest.mark.integration


def expected(tag: str) -> tuple[set[bytes], set[bytes]]:
    committed = {f"{tag}-c{t}-{i}".encode() for t in (1, 2) for i in range(10)}
    aborted = {f"{tag}-a1-{i}".encode() for i in range(10)}
    return committed, aborted


def check_topic(bootstrap: str, topic: str, tag: str) -> None:
    committed, aborted = expected(tag)
    rc = consume_all(bootstrap, topic, 2, "read_committed", 20)
    assert {v for _, _, v in rc} == committed and len(rc) == 20
    ru = consume_all(bootstrap, topic, 2, "read_uncommitted", 30)
    assert {v for _, _, v in ru} == committed | aborted and len(ru) == 30


def test_aiokafka_transactions(txn_broker: BrokerProcess) -> None:  # noqa: F811
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    bootstrap = txn_broker.bootstrap
    topic = unique_topic("txn-aiokafka")
    create_topic(bootstrap, topic, 2)
    group = f"aio-{uuid.uuid4().hex[:6]}"

    async def run() -> tuple[list[bytes], dict[int, int]]:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"aio-{group}")
        await p.start()
        try:
            for tag, commit in (("aio-c1", True), ("aio-a1", False), ("aio-c2", True)):
                await p.begin_transaction()
                for i in range(10):
                    await p.send(topic, f"{tag}-{i}".encode(), partition=i % 2)
                if tag == "aio-c2":
                    offsets = {TopicPartition(topic, 0): 4, TopicPartition(topic, 1): 6}
                    await p.send_offsets_to_transaction(offsets, group)
                if commit:
                    await p.commit_transaction()
                else:
                    await p.abort_transaction()
        finally:
            await p.stop()
        c = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=group,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await c.start()
        try:
            tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
            committed = {tp.partition: await c.committed(tp) for tp in tps}
            c.assign(tps)
            await c.seek_to_beginning(*tps)
            got: list[bytes] = []
            while len(got) < 20:
                batch = await c.getmany(timeout_ms=int(TIMEOUT * 1000))
                assert batch, f"only {len(got)} records"
                got += [m.value for ms in batch.values() for m in ms if m.value is not None]
            extra = await c.getmany(timeout_ms=1500)
            got += [m.value for ms in extra.values() for m in ms if m.value is not None]
            return got, committed
        finally:
            await c.stop()

    got, committed = asyncio.run(run())
    assert committed == {0: 4, 1: 6}
    assert sorted(got) == sorted(expected("aio")[0])
    check_topic(bootstrap, topic, "aio")


def test_kafka_python_transactions(txn_broker: BrokerProcess) -> None:  # noqa: F811
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    bootstrap = txn_broker.bootstrap
    topic = unique_topic("txn-kpy")
    create_topic(bootstrap, topic, 2)
    group = f"kpy-{uuid.uuid4().hex[:6]}"
    tid = f"kpy-{group}"
    p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        p.init_transactions()
        for tag, commit in (("kpy-c1", True), ("kpy-a1", False), ("kpy-c2", True)):
            p.begin_transaction()
            for i in range(10):
                p.send(topic, f"{tag}-{i}".encode(), partition=i % 2)
            p.flush()
            if tag == "kpy-c2":
                offsets = {
                    TopicPartition(topic, 0): OffsetAndMetadata(4, "", -1),
                    TopicPartition(topic, 1): OffsetAndMetadata(6, "", -1),
                }
                p.send_offsets_to_transaction(offsets, group)
                # the admin API sees it ongoing, with its partitions (and lists it)
                (desc,) = admin.describe_transactions([tid]).values()
                assert desc.state.value == "Ongoing"
                assert desc.topic_partitions == {TopicPartition(topic, 0), TopicPartition(topic, 1)}
                listed = [t for ts in admin.list_transactions().values() for t in ts]
                assert tid in {t.transactional_id for t in listed}
            if commit:
                p.commit_transaction()
            else:
                p.abort_transaction()
        (desc,) = admin.describe_transactions([tid]).values()
        assert desc.state.value == "CompleteCommit"
    finally:
        p.close(timeout=10)
        admin.close()
    c = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=3000,
    )
    try:
        tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
        assert [c.committed(tp) for tp in tps] == [4, 6]
        c.assign(tps)
        c.seek_to_beginning()
        got = [m.value for m in c]
    finally:
        c.close()
    assert sorted(got) == sorted(expected("kpy")[0])
    check_topic(bootstrap, topic, "kpy")


def test_kafkajs_transactions(txn_broker: BrokerProcess, kafkajs: Path) -> None:  # noqa: F811
    bootstrap = txn_broker.bootstrap
    topic = unique_topic("txn-js")
    create_topic(bootstrap, topic, 2)
    group = f"js-{uuid.uuid4().hex[:6]}"
    proc = subprocess.run(
        ["node", str(kafkajs / "txn.js"), bootstrap, topic, f"js-{group}", group],
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    out = json.loads(proc.stdout)
    assert sorted(out["values"]) == sorted(v.decode() for v in expected("js")[0])
    (t,) = out["offsets"]
    assert {p["partition"]: p["offset"] for p in t["partitions"]} == {0: "4", 1: "6"}
    check_topic(bootstrap, topic, "js")
