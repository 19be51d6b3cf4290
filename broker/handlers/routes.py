"""The route table: every API this broker serves, the versions it serves and the handler
that serves them, in this one place (no package scan, no registration by decorator).

Handlers are named after their API (``produce``, ``find_coordinator``, ...) in one module
per API family, whose docstring states the versions served and the deviations from
Kafka. ApiVersions advertises exactly this table; the connection dispatches on it.
"""

from __future__ import annotations

from broker.handlers import (
    acls,
    api_versions,
    client_quotas,
    configs,
    consumer_groups,
    delete_records,
    describe_cluster,
    describe_producers,
    describe_quorum,
    describe_topic_partitions,
    features,
    fetch,
    group_offsets,
    groups,
    leader_epoch,
    leadership,
    list_offsets,
    log_dirs,
    metadata,
    produce,
    producer_ids,
    sasl,
    scram_users,
    topics_admin,
    transactions,
    write_txn_markers,
)
from broker.handlers.registry import ApiHandler as Route
from protocol.apis import ApiKey


def build_routes() -> dict[int, Route]:
    routes = (
        Route(ApiKey.PRODUCE, 0, 11, produce.produce, produce.decode),
        Route(ApiKey.FETCH, 4, 17, fetch.fetch),
        Route(ApiKey.LIST_OFFSETS, 0, 10, list_offsets.list_offsets),
        Route(ApiKey.METADATA, 0, 13, metadata.metadata),
        Route(ApiKey.OFFSET_COMMIT, 0, 9, group_offsets.offset_commit),
        Route(ApiKey.OFFSET_FETCH, 0, 9, group_offsets.offset_fetch),
        Route(ApiKey.FIND_COORDINATOR, 0, 4, groups.find_coordinator),
        Route(ApiKey.JOIN_GROUP, 0, 9, groups.join_group),
        Route(ApiKey.HEARTBEAT, 0, 4, groups.heartbeat),
        Route(ApiKey.LEAVE_GROUP, 0, 5, groups.leave_group),
        Route(ApiKey.SYNC_GROUP, 0, 5, groups.sync_group),
        Route(ApiKey.DESCRIBE_GROUPS, 0, 5, groups.describe_groups),
        Route(ApiKey.LIST_GROUPS, 0, 5, groups.list_groups),
        Route(ApiKey.API_VERSIONS, 0, 4, api_versions.api_versions),
        Route(ApiKey.CREATE_TOPICS, 0, 7, topics_admin.create_topics),
        Route(ApiKey.DELETE_TOPICS, 0, 6, topics_admin.delete_topics),
        Route(ApiKey.DELETE_RECORDS, 0, 2, delete_records.delete_records),
        Route(ApiKey.INIT_PRODUCER_ID, 0, 4, producer_ids.init_producer_id),
        Route(ApiKey.OFFSET_FOR_LEADER_EPOCH, 0, 4, leader_epoch.offset_for_leader_epoch),
        Route(ApiKey.DESCRIBE_CONFIGS, 0, 4, configs.describe_configs),
        Route(ApiKey.ALTER_CONFIGS, 0, 2, configs.alter_configs),
        Route(ApiKey.CREATE_PARTITIONS, 0, 3, topics_admin.create_partitions),
        Route(ApiKey.DELETE_GROUPS, 0, 2, groups.delete_groups),
        Route(ApiKey.INCREMENTAL_ALTER_CONFIGS, 0, 1, configs.incremental_alter_configs),
        Route(ApiKey.OFFSET_DELETE, 0, 0, group_offsets.offset_delete),
        Route(ApiKey.SASL_HANDSHAKE, 0, 1, sasl.sasl_handshake),
        Route(ApiKey.SASL_AUTHENTICATE, 0, 2, sasl.sasl_authenticate),
        Route(ApiKey.DESCRIBE_ACLS, 1, 3, acls.describe_acls),
        Route(ApiKey.CREATE_ACLS, 1, 3, acls.create_acls),
        Route(ApiKey.DELETE_ACLS, 1, 3, acls.delete_acls),
        Route(
            ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS,
            0,
            0,
            scram_users.describe_user_scram_credentials,
        ),
        Route(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, 0, scram_users.alter_user_scram_credentials),
        Route(ApiKey.DESCRIBE_CLUSTER, 0, 2, describe_cluster.describe_cluster),
        # Kafka 4 admin APIs (issue 12)
        Route(
            ApiKey.DESCRIBE_TOPIC_PARTITIONS,
            0,
            0,
            describe_topic_partitions.describe_topic_partitions,
        ),
        Route(ApiKey.DESCRIBE_LOG_DIRS, 1, 4, log_dirs.describe_log_dirs),
        Route(ApiKey.ALTER_REPLICA_LOG_DIRS, 1, 2, log_dirs.alter_replica_log_dirs),
        Route(ApiKey.ELECT_LEADERS, 0, 2, leadership.elect_leaders),
        Route(ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, 0, leadership.list_partition_reassignments),
        Route(ApiKey.ALTER_PARTITION_REASSIGNMENTS, 0, 1, leadership.alter_partition_reassignments),
        Route(ApiKey.DESCRIBE_PRODUCERS, 0, 0, describe_producers.describe_producers),
        Route(ApiKey.WRITE_TXN_MARKERS, 0, 2, write_txn_markers.write_txn_markers),
        Route(ApiKey.DESCRIBE_QUORUM, 0, 2, describe_quorum.describe_quorum),
        Route(ApiKey.DESCRIBE_CLIENT_QUOTAS, 0, 1, client_quotas.describe_client_quotas),
        Route(ApiKey.ALTER_CLIENT_QUOTAS, 0, 1, client_quotas.alter_client_quotas),
        Route(ApiKey.UPDATE_FEATURES, 0, 2, features.update_features),
        Route(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, 1, consumer_groups.consumer_group_heartbeat),
        Route(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, 1, consumer_groups.consumer_group_describe),
        Route(ApiKey.ADD_PARTITIONS_TO_TXN, 0, 3, transactions.add_partitions_to_txn),
        Route(ApiKey.ADD_OFFSETS_TO_TXN, 0, 3, transactions.add_offsets_to_txn),
        Route(ApiKey.END_TXN, 0, 4, transactions.end_txn),
        Route(ApiKey.TXN_OFFSET_COMMIT, 0, 3, transactions.txn_offset_commit),
        Route(ApiKey.DESCRIBE_TRANSACTIONS, 0, 0, transactions.describe_transactions),
        Route(ApiKey.LIST_TRANSACTIONS, 0, 1, transactions.list_transactions),
    )
    table: dict[int, Route] = {}
    for route in routes:
        if route.key in table:
            raise RuntimeError(f"API {ApiKey(route.key).name} routed twice")
        table[int(route.key)] = route
    return table
