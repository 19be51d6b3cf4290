"""The route table: every API this broker serves, the versions it serves and the handler
that serves them, in this one place (no package scan, no registration by decorator).

Handlers are named after their API (``produce``, ``find_coordinator``, ...) in one module
per API family, whose docstring states the versions served and the deviations from
Kafka. ApiVersions advertises exactly this table; the connection dispatches on it.
"""

from __future__ import annotations

from broker.handlers import (
    api_versions,
    configs,
    delete_records,
    describe_cluster,
    fetch,
    group_offsets,
    groups,
    leader_epoch,
    list_offsets,
    metadata,
    produce,
    producer_ids,
    topics_admin,
    transactions,
)
from broker.handlers.registry import ApiHandler as Route
from protocol.apis import ApiKey


def build_routes() -> dict[int, Route]:
    routes = (
        Route(ApiKey.PRODUCE, 0, 11, produce.produce, produce.decode),
        Route(ApiKey.FETCH, 4, 16, fetch.fetch),
        Route(ApiKey.LIST_OFFSETS, 0, 8, list_offsets.list_offsets),
        Route(ApiKey.METADATA, 0, 12, metadata.metadata),
        Route(ApiKey.OFFSET_COMMIT, 0, 8, group_offsets.offset_commit),
        Route(ApiKey.OFFSET_FETCH, 0, 8, group_offsets.offset_fetch),
        Route(ApiKey.FIND_COORDINATOR, 0, 4, groups.find_coordinator),
        Route(ApiKey.JOIN_GROUP, 0, 9, groups.join_group),
        Route(ApiKey.HEARTBEAT, 0, 4, groups.heartbeat),
        Route(ApiKey.LEAVE_GROUP, 0, 5, groups.leave_group),
        Route(ApiKey.SYNC_GROUP, 0, 5, groups.sync_group),
        Route(ApiKey.DESCRIBE_GROUPS, 0, 5, groups.describe_groups),
        Route(ApiKey.LIST_GROUPS, 0, 4, groups.list_groups),
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
        Route(ApiKey.DESCRIBE_CLUSTER, 0, 1, describe_cluster.describe_cluster),
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
