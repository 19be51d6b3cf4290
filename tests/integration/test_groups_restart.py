"""A broker restarted under a running group, with etcd as the metadata store: the group is
reloaded from etcd, its members go on without losing their place, and no record is lost or
consumed twice."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import pytest

from tests.fixtures.broker import start_broker
from tests.fixtures.etcd import etcd_url  # noqa: F401 - fixture
from tests.integration.group_member import (
    committed,
    create_topic,
    produce,
    start_member,
    wait_until,
)

pytestmark = pytest.mark.integration

PARTITIONS = 4


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_group_resumes_after_broker_restart_on_etcd(
    etcd_url: str,  # noqa: F811
    tmp_path: Path,
    how: str,
) -> None:
    prefix = f"/restart-{uuid.uuid4().hex[:8]}"
    broker = start_broker(
        tmp_path / "broker", meta_url=etcd_url, extra_args=("--meta-prefix", prefix)
    )
    bs, topic, group = broker.bootstrap, "resume", "resume-group"
    members = []
    try:
        create_topic(bs, topic, PARTITIONS)
        members = [
            start_member("confluent", bs, topic, group, tmp_path, "c"),
            start_member("kafka-python", bs, topic, group, tmp_path, "k"),
        ]
        wait_until(lambda: all(m.assigned() for m in members), 60, "both members assigned")
        produce(bs, topic, PARTITIONS, 40, "a")
        wait_until(lambda: sum(len(m.records()) for m in members) == 40, 60, "first 40")
        assert committed(bs, group) == dict.fromkeys(range(PARTITIONS), 10)
        events_before = [len(m.events()) for m in members]

        if how == "sigterm":
            broker.restart()
        else:
            broker.kill9()
            broker.start()
        assert "loaded group" not in broker.logs[0].read_text()

        produce(bs, topic, PARTITIONS, 40, "b")
        wait_until(lambda: sum(len(m.records()) for m in members) >= 80, 90, "40 more")
        assert committed(bs, group) == dict.fromkeys(range(PARTITIONS), 20)
        # the new broker took the group over from etcd rather than starting a new one
        assert f"loaded group {group} generation" in broker.logs[-1].read_text()
        if how == "sigterm":  # a clean restart costs the members no rebalance at all
            assert [len(m.events()) for m in members] == events_before
        for m in members:
            assert m.stop() == 0
    finally:
        for m in members:
            if m.proc.poll() is None:
                m.kill9()
        broker.stop()
    counts = Counter(r for m in members for r in m.records())
    assert sum(counts.values()) == 80 and max(counts.values()) == 1
    assert set(counts) == {(p, o) for p in range(PARTITIONS) for o in range(20)}


def test_metadata_outage_answers_retriable_errors_then_recovers(tmp_path: Path) -> None:
    from kafka.protocol.consumer import (
        HeartbeatRequest,
        HeartbeatResponse,
        OffsetCommitRequest,
        OffsetCommitResponse,
    )

    from tests.fixtures.etcd import start_etcd
    from tests.integration.kafka_raw import RawConn

    (tmp_path / "etcd").mkdir()
    etcd = start_etcd(tmp_path / "etcd")
    broker = start_broker(tmp_path / "broker", meta_url=etcd.url)
    try:
        create_topic(broker.bootstrap, "outage", 1)
        part = OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition
        commit = OffsetCommitRequest(
            group_id="solo",
            generation_id_or_member_epoch=-1,
            member_id="",
            topics=[
                OffsetCommitRequest.OffsetCommitRequestTopic(
                    name="outage",
                    partitions=[part(partition_index=0, committed_offset=0, committed_metadata="")],
                )
            ],
        )
        hb = HeartbeatRequest(group_id="never-seen", generation_id=1, member_id="m")
        with RawConn(broker.port, timeout=30) as c:
            etcd.stop()
            # the store is gone: retriable COORDINATOR_NOT_AVAILABLE, connection kept open
            assert c.call(hb, HeartbeatResponse, 3).error_code == 15
            res = c.call(commit, OffsetCommitResponse, 7)
            assert res.topics[0].partitions[0].error_code == 15
            etcd = start_etcd(tmp_path / "etcd", etcd.client_port, etcd.peer_port)
            wait_until(
                lambda: (
                    c.call(commit, OffsetCommitResponse, 7).topics[0].partitions[0].error_code == 0
                ),
                30,
                "commits after etcd is back",
            )
            assert c.call(hb, HeartbeatResponse, 3).error_code == 25  # UNKNOWN_MEMBER_ID
        assert committed(broker.bootstrap, "solo") == {0: 0}
    finally:
        broker.stop()
        etcd.stop()
