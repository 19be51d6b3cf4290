"""The ACL matrix of the admin and KIP-848 APIs (docs/operations.md, "ACLs"), on the
session's secured broker: each API succeeds for a principal holding the ACL Kafka asks
for and answers Kafka's error (and where: top level, per topic or per partition) for
one without it. Two users are made through the admin API for this module: ``carol``
holds the ACLs, ``dave`` holds only DESCRIBE on the topic and READ on a group of his own
(so the checks of READ vs DESCRIBE and group vs topic are told apart)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka.admin import (
    AclOperation,
    AdminClient,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from kafka.protocol import admin as ka

from protocol.consumer_groups import (
    ConsumerGroupDescribeRequest,
    ConsumerGroupDescribeResponse,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
)
from tests.integration.kafka_raw import RawConn, api_versions
from tests.integration.security.conftest import SecureBroker
from tests.integration.security.raw_sasl import login
from tests.integration.security.test_acls import TIMEOUT, acl, add_acls, create_topics

pytestmark = pytest.mark.integration
OK, TOPIC_AUTHZ, GROUP_AUTHZ, CLUSTER_AUTHZ = 0, 29, 30, 31
READ, DESCRIBE = 3, 8  # Kafka's AclOperation codes (KIP-430 bitfields)


@dataclass
class World:
    sb: SecureBroker
    topic: str
    hidden: str  # nobody but the admin may see it
    group: str  # carol's
    dave_group: str
    passwords: dict[str, str]
    shared_group: str = ""  # carol consumes carol_topic in it; dave may DESCRIBE the group
    carol_topic: str = ""  # dave may not DESCRIBE it

    def call(self, user: str, req: Any, resp_cls: Any, version: int) -> Any:
        with RawConn(self.sb.ports["SASL_PLAINTEXT"]) as conn:
            login(conn, user, self.passwords[user], "SCRAM-SHA-512")
            return conn.call(req, resp_cls, version, 10)


@pytest.fixture(scope="module")
def world(secure_broker: SecureBroker) -> Iterator[World]:
    tag = uuid.uuid4().hex[:8]
    admin = AdminClient(secure_broker.confluent("SASL_PLAINTEXT", "admin"))
    users = {f"carol{tag}": f"c-{tag}", f"dave{tag}": f"d-{tag}"}
    ups = [
        UserScramCredentialUpsertion(
            u, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), pw.encode()
        )
        for u, pw in users.items()
    ]
    for fut in admin.alter_user_scram_credentials(list[Any](ups), request_timeout=TIMEOUT).values():
        fut.result(TIMEOUT)
    carol, dave = (f"User:{u}" for u in users)
    w = World(secure_broker, f"az-{tag}", f"az-hidden-{tag}", f"azg-{tag}", f"azd-{tag}", users)
    w.shared_group, w.carol_topic = f"azs-{tag}", f"az-carol-{tag}"
    create_topics(admin, w.topic, w.hidden, w.carol_topic)
    cluster_ops = (
        AclOperation.DESCRIBE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
    )
    add_acls(
        admin,
        *(acl(ResourceType.BROKER, "kafka-cluster", carol, op) for op in cluster_ops),
        acl(ResourceType.TOPIC, w.topic, carol, AclOperation.READ),
        acl(ResourceType.GROUP, w.group, carol, AclOperation.READ),
        acl(ResourceType.TOPIC, w.topic, dave, AclOperation.DESCRIBE),
        acl(ResourceType.GROUP, w.dave_group, dave, AclOperation.READ),
        acl(ResourceType.TOPIC, w.carol_topic, carol, AclOperation.READ),
        acl(ResourceType.GROUP, w.shared_group, carol, AclOperation.READ),
        acl(ResourceType.GROUP, w.shared_group, dave, AclOperation.DESCRIBE),
    )
    yield w


def users(w: World) -> tuple[str, str]:
    carol, dave = sorted(w.passwords)
    return carol, dave


def test_describe_topic_partitions(world: World) -> None:
    carol, dave = users(world)
    T = ka.DescribeTopicPartitionsRequest.TopicRequest
    req = ka.DescribeTopicPartitionsRequest(
        topics=[T(name=world.topic), T(name=world.hidden)],
        response_partition_limit=100,
        cursor=None,
    )
    resp = world.call(dave, req, ka.DescribeTopicPartitionsResponse, 0)
    codes = {t.name: t.error_code for t in resp.topics}
    assert codes == {world.topic: OK, world.hidden: TOPIC_AUTHZ}
    (seen,) = [t for t in resp.topics if t.name == world.topic]
    assert seen.topic_authorized_operations == 1 << DESCRIBE
    every = ka.DescribeTopicPartitionsRequest(topics=[], response_partition_limit=2000, cursor=None)
    names = {t.name for t in world.call(carol, every, ka.DescribeTopicPartitionsResponse, 0).topics}
    assert world.topic in names and world.hidden not in names


def test_log_dirs_need_describe_and_alter_cluster(world: World) -> None:
    carol, dave = users(world)
    req = ka.DescribeLogDirsRequest(topics=None)
    ok = world.call(carol, req, ka.DescribeLogDirsResponse, 4)
    assert ok.error_code == OK and len(ok.results) == 1
    denied = world.call(dave, req, ka.DescribeLogDirsResponse, 4)
    assert denied.error_code == CLUSTER_AUTHZ and denied.results == []
    D = ka.AlterReplicaLogDirsRequest.AlterReplicaLogDir
    alter = ka.AlterReplicaLogDirsRequest(
        dirs=[
            D(
                path="/elsewhere",
                topics=[D.AlterReplicaLogDirTopic(name=world.topic, partitions=[0])],
            )
        ]
    )
    codes = [
        p.error_code
        for t in world.call(carol, alter, ka.AlterReplicaLogDirsResponse, 2).results
        for p in t.partitions
    ]
    assert codes == [57]  # LOG_DIR_NOT_FOUND: authorized, then refused for the path
    codes = [
        p.error_code
        for t in world.call(dave, alter, ka.AlterReplicaLogDirsResponse, 2).results
        for p in t.partitions
    ]
    assert codes == [CLUSTER_AUTHZ]


def test_leadership_apis_need_alter_and_describe_cluster(world: World) -> None:
    carol, dave = users(world)
    TP = ka.ElectLeadersRequest.TopicPartitions
    elect = ka.ElectLeadersRequest(
        election_type=0, timeout_ms=10000, topic_partitions=[TP(topic=world.topic, partitions=[0])]
    )
    ok = world.call(carol, elect, ka.ElectLeadersResponse, 2)
    assert ok.error_code == OK
    assert ok.replica_election_results[0].partition_result[0].error_code in (
        OK,
        84,
    )
    denied = world.call(dave, elect, ka.ElectLeadersResponse, 2)
    assert denied.error_code == CLUSTER_AUTHZ
    assert denied.replica_election_results[0].partition_result[0].error_code == CLUSTER_AUTHZ
    lst = ka.ListPartitionReassignmentsRequest(timeout_ms=10000, topics=None)
    assert world.call(carol, lst, ka.ListPartitionReassignmentsResponse, 0).error_code == OK
    assert (
        world.call(dave, lst, ka.ListPartitionReassignmentsResponse, 0).error_code == CLUSTER_AUTHZ
    )
    RT = ka.AlterPartitionReassignmentsRequest.ReassignableTopic
    alter = ka.AlterPartitionReassignmentsRequest(
        timeout_ms=10000,
        topics=[
            RT(
                name=world.topic,
                partitions=[RT.ReassignablePartition(partition_index=0, replicas=None)],
            )
        ],
    )
    ok = world.call(carol, alter, ka.AlterPartitionReassignmentsResponse, 0)
    assert ok.error_code == OK and ok.responses[0].partitions[0].error_code == 85  # NO_REASSIGNMENT
    denied = world.call(dave, alter, ka.AlterPartitionReassignmentsResponse, 0)
    assert denied.error_code == CLUSTER_AUTHZ
    assert denied.responses[0].partitions[0].error_code == CLUSTER_AUTHZ


def test_describe_producers_needs_read_per_partition(world: World) -> None:
    carol, dave = users(world)
    T = ka.DescribeProducersRequest.TopicRequest
    req = ka.DescribeProducersRequest(topics=[T(name=world.topic, partition_indexes=[0])])
    ok = world.call(carol, req, ka.DescribeProducersResponse, 0)
    assert ok.topics[0].partitions[0].error_code == OK
    denied = world.call(dave, req, ka.DescribeProducersResponse, 0)  # DESCRIBE is not READ
    assert denied.topics[0].partitions[0].error_code == TOPIC_AUTHZ


def test_describe_quorum_needs_describe_cluster(world: World) -> None:
    carol, dave = users(world)
    TD = ka.DescribeQuorumRequest.TopicData
    req = ka.DescribeQuorumRequest(
        topics=[
            TD(topic_name="__cluster_metadata", partitions=[TD.PartitionData(partition_index=0)])
        ]
    )
    ok = world.call(carol, req, ka.DescribeQuorumResponse, 1)
    assert ok.error_code == OK and ok.topics[0].partitions[0].error_code == OK
    assert world.call(dave, req, ka.DescribeQuorumResponse, 1).error_code == CLUSTER_AUTHZ


def test_client_quotas_need_describe_and_alter_configs(world: World) -> None:
    carol, dave = users(world)
    describe = ka.DescribeClientQuotasRequest(components=[], strict=False)
    assert world.call(carol, describe, ka.DescribeClientQuotasResponse, 1).error_code == OK
    denied = world.call(dave, describe, ka.DescribeClientQuotasResponse, 1)
    assert denied.error_code == CLUSTER_AUTHZ
    e = ka.AlterClientQuotasRequest.EntryData
    alter = ka.AlterClientQuotasRequest(
        validate_only=True,
        entries=[
            e(
                entity=[e.EntityData(entity_type="client-id", entity_name="az")],
                ops=[e.OpData(key="producer_byte_rate", value=1000.0, remove=False)],
            )
        ],
    )
    assert world.call(carol, alter, ka.AlterClientQuotasResponse, 1).entries[0].error_code == OK
    got = world.call(dave, alter, ka.AlterClientQuotasResponse, 1).entries[0].error_code
    assert got == CLUSTER_AUTHZ


def test_update_features_needs_alter_cluster(world: World) -> None:
    carol, dave = users(world)
    versions = api_versions(world.sb.ports["PLAINTEXT"])
    finalized = {f.name: f.max_version_level for f in versions.finalized_features}
    level = finalized["metadata.version"]
    F = ka.UpdateFeaturesRequest.FeatureUpdateKey
    req = ka.UpdateFeaturesRequest(
        timeout_ms=10000,
        validate_only=True,
        feature_updates=[F(feature="metadata.version", max_version_level=level, upgrade_type=1)],
    )
    ok = world.call(carol, req, ka.UpdateFeaturesResponse, 1)
    assert ok.error_code == OK and [r.error_code for r in ok.results] == [OK]
    denied = world.call(dave, req, ka.UpdateFeaturesResponse, 1)
    assert denied.error_code == CLUSTER_AUTHZ
    assert [r.error_code for r in denied.results] == [CLUSTER_AUTHZ]


def test_write_txn_markers_needs_cluster_action(world: World) -> None:
    from kafka.protocol.producer.transaction import (
        WriteTxnMarkersRequest,
        WriteTxnMarkersResponse,
    )

    _carol, dave = users(world)
    M = WriteTxnMarkersRequest.WritableTxnMarker
    marker = M(
        producer_id=1,
        producer_epoch=0,
        transaction_result=False,
        topics=[M.WritableTxnMarkerTopic(name=world.topic, partition_indexes=[0])],
        coordinator_epoch=0,
    )
    resp = world.call(dave, WriteTxnMarkersRequest(markers=[marker]), WriteTxnMarkersResponse, 1)
    codes = [p.error_code for m in resp.markers for t in m.topics for p in t.partitions]
    assert codes == [CLUSTER_AUTHZ]


def heartbeat(
    w: World, user: str, group: str, topics: list[str] | None, regex: str | None = None
) -> Any:
    req = ConsumerGroupHeartbeatRequest(
        group_id=group,
        member_id=uuid.uuid4().hex[:22],
        member_epoch=0,
        instance_id=None,
        rack_id=None,
        rebalance_timeout_ms=30000,
        subscribed_topic_names=topics,
        subscribed_topic_regex=regex,
        server_assignor=None,
        topic_partitions=[],
    )
    return w.call(user, req, ConsumerGroupHeartbeatResponse, 1)


def test_consumer_group_heartbeat_needs_read_group_and_describe_topics(world: World) -> None:
    carol, dave = users(world)
    assert heartbeat(world, carol, world.group, [world.topic]).error_code == OK
    assert heartbeat(world, dave, world.group, [world.topic]).error_code == GROUP_AUTHZ
    assert heartbeat(world, dave, world.dave_group, [world.topic]).error_code == OK
    got = heartbeat(world, dave, world.dave_group, [world.topic, world.hidden]).error_code
    assert got == TOPIC_AUTHZ


def test_regex_subscription_gets_only_describable_topics(world: World) -> None:
    """A regex matching the three topics of this module assigns dave only the one he may
    DESCRIBE (Kafka 4 filters regex matches by the member's DESCRIBE permission)."""
    _carol, dave = users(world)
    group = f"azr-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(world.sb.confluent("SASL_PLAINTEXT", "admin"))
    add_acls(admin, acl(ResourceType.GROUP, group, f"User:{dave}", AclOperation.READ))
    tag = world.topic.removeprefix("az-")
    assert heartbeat(world, dave, group, [], f"az-(hidden-|carol-)?{tag}").error_code == OK
    req = ConsumerGroupDescribeRequest(group_ids=[group], include_authorized_operations=False)
    (g,) = world.call(dave, req, ConsumerGroupDescribeResponse, 1).groups
    assert g.error_code == OK  # a hidden topic in the assignment would refuse the group
    names = {tp.topic_name for m in g.members for tp in m.target_assignment.topic_partitions}
    assert names == {world.topic}


def test_consumer_group_describe_needs_describe_group(world: World) -> None:
    carol, dave = users(world)
    assert heartbeat(world, carol, world.group, [world.topic]).error_code == OK
    req = ConsumerGroupDescribeRequest(group_ids=[world.group], include_authorized_operations=True)
    (g,) = world.call(carol, req, ConsumerGroupDescribeResponse, 1).groups
    assert g.error_code == OK and g.members
    assert g.authorized_operations == (1 << READ) | (1 << DESCRIBE)
    (g,) = world.call(dave, req, ConsumerGroupDescribeResponse, 1).groups
    assert g.error_code == GROUP_AUTHZ and not g.members


def test_consumer_group_describe_hides_groups_with_undescribable_topics(world: World) -> None:
    carol, dave = users(world)
    assert heartbeat(world, carol, world.shared_group, [world.carol_topic]).error_code == OK
    req = ConsumerGroupDescribeRequest(
        group_ids=[world.shared_group], include_authorized_operations=False
    )
    (g,) = world.call(carol, req, ConsumerGroupDescribeResponse, 1).groups
    assert g.error_code == OK
    names = {tp.topic_name for m in g.members for tp in m.target_assignment.topic_partitions}
    assert names == {world.carol_topic}
    (g,) = world.call(dave, req, ConsumerGroupDescribeResponse, 1).groups
    assert g.error_code == TOPIC_AUTHZ and not g.members


def test_kip848_offset_and_list_paths_keep_their_checks(world: World) -> None:
    """OffsetCommit v9 / OffsetFetch v9 (member epochs of a consumer group) and ListGroups
    v5 (type filter) on a KIP-848 group: READ / DESCRIBE group, DESCRIBE to be listed."""
    from kafka.protocol.admin import ListGroupsRequest, ListGroupsResponse
    from kafka.protocol.consumer import (
        OffsetCommitRequest,
        OffsetCommitResponse,
        OffsetFetchRequest,
        OffsetFetchResponse,
    )

    carol, dave = users(world)
    joined = heartbeat(world, carol, world.group, [world.topic])
    assert joined.error_code == OK
    T = OffsetCommitRequest.OffsetCommitRequestTopic
    P = T.OffsetCommitRequestPartition
    part = P(
        partition_index=0, committed_offset=0, committed_leader_epoch=-1, committed_metadata=""
    )
    commit = OffsetCommitRequest(
        group_id=world.group,
        member_id=joined.member_id,
        generation_id_or_member_epoch=joined.member_epoch,
        group_instance_id=None,
        topics=[T(name=world.topic, partitions=[part])],
    )
    resp = world.call(carol, commit, OffsetCommitResponse, 9)
    assert resp.topics[0].partitions[0].error_code == OK
    resp = world.call(dave, commit, OffsetCommitResponse, 9)
    assert resp.topics[0].partitions[0].error_code == GROUP_AUTHZ
    G = OffsetFetchRequest.OffsetFetchRequestGroup
    fetch = OffsetFetchRequest(
        require_stable=False,
        groups=[G(group_id=world.group, member_id=None, member_epoch=-1, topics=None)],
    )
    (g,) = world.call(carol, fetch, OffsetFetchResponse, 9).groups
    assert g.error_code == OK and [t.name for t in g.topics] == [world.topic]
    (g,) = world.call(dave, fetch, OffsetFetchResponse, 9).groups
    assert g.error_code == GROUP_AUTHZ
    lst = ListGroupsRequest(states_filter=[], types_filter=["consumer"])
    listed = {g.group_id for g in world.call(carol, lst, ListGroupsResponse, 5).groups}
    assert world.group in listed
    listed = {g.group_id for g in world.call(dave, lst, ListGroupsResponse, 5).groups}
    assert world.group not in listed
