"""Kafka API keys by name, and which request versions are flexible: one place for both.

``ApiKey`` names every API key of Kafka's message schemas up to Kafka 4.x. ``FIRST_FLEXIBLE``
records, from those schemas, the first *flexible* version of each API (compact strings and
arrays, tagged fields; request header v2 and, except for ApiVersions, response header
v1), or None for an API that is never flexible. Flexibility is monotonic ("N+"), so a
version above the highest one known is flexible iff it is at least the first flexible
one. Every API added after key 54 is flexible from version 0. A unit test checks this
table against kafka-python's generated classes for every key they model.
"""

from __future__ import annotations

from enum import IntEnum


class ApiKey(IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    LEADER_AND_ISR = 4
    STOP_REPLICA = 5
    UPDATE_METADATA = 6
    CONTROLLED_SHUTDOWN = 7
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    ALTER_REPLICA_LOG_DIRS = 34
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    CREATE_DELEGATION_TOKEN = 38
    RENEW_DELEGATION_TOKEN = 39
    EXPIRE_DELEGATION_TOKEN = 40
    DESCRIBE_DELEGATION_TOKEN = 41
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    INCREMENTAL_ALTER_CONFIGS = 44
    ALTER_PARTITION_REASSIGNMENTS = 45
    LIST_PARTITION_REASSIGNMENTS = 46
    OFFSET_DELETE = 47
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    VOTE = 52
    BEGIN_QUORUM_EPOCH = 53
    END_QUORUM_EPOCH = 54
    DESCRIBE_QUORUM = 55
    ALTER_PARTITION = 56
    UPDATE_FEATURES = 57
    ENVELOPE = 58
    FETCH_SNAPSHOT = 59
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    BROKER_REGISTRATION = 62
    BROKER_HEARTBEAT = 63
    UNREGISTER_BROKER = 64
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    ALLOCATE_PRODUCER_IDS = 67
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69
    CONTROLLER_REGISTRATION = 70
    GET_TELEMETRY_SUBSCRIPTIONS = 71
    PUSH_TELEMETRY = 72
    ASSIGN_REPLICAS_TO_DIRS = 73
    LIST_CLIENT_METRICS_RESOURCES = 74
    DESCRIBE_TOPIC_PARTITIONS = 75


FIRST_FLEXIBLE: dict[int, int | None] = {
    0: 9, 1: 12, 2: 6, 3: 9, 4: 4, 5: 2, 6: 6, 7: 3, 8: 8, 9: 6, 10: 3, 11: 6, 12: 4,
    13: 4, 14: 4, 15: 5, 16: 3, 17: None, 18: 3, 19: 5, 20: 4, 21: 2, 22: 2, 23: 4,
    24: 3, 25: 3, 26: 3, 27: 1, 28: 3, 29: 2, 30: 2, 31: 2, 32: 4, 33: 2, 34: 2, 35: 2,
    36: 2, 37: 2, 38: 2, 39: 2, 40: 2, 41: 2, 42: 2, 43: 2, 44: 1, 45: 0, 46: 0,
    47: None, 48: 1, 49: 1, 50: 0, 51: 0, 52: 0, 53: 1, 54: 1,
}  # fmt: skip
DEFAULT_FIRST_FLEXIBLE = 0  # every API after key 54


def first_flexible_version(api_key: int) -> int | None:
    """The first flexible request version of ``api_key`` (None: the API is never flexible)."""
    return FIRST_FLEXIBLE.get(api_key, DEFAULT_FIRST_FLEXIBLE)


def is_flexible(api_key: int, api_version: int) -> bool:
    """Whether ``api_version`` of ``api_key`` uses the flexible (compact, tagged) encoding,
    in its request and in its response alike."""
    first = first_flexible_version(api_key)
    return first is not None and api_version >= first


def api_name(api_key: int) -> str:
    """``ApiKey`` name of a key, or ``key N`` for one this table does not know."""
    try:
        return ApiKey(api_key).name
    except ValueError:
        return f"key {api_key}"
