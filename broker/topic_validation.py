"""Topic validation: names, partition counts, replication factors, replica assignments.

Pure checks, no I/O: each raises ``KafkaProtocolError`` with the Kafka error code of the
rule it enforces (``is_valid_topic_name`` answers a bool instead). ``TopicManager``
(``broker.topics``) applies them on CreateTopics, CreatePartitions and auto-creation;
the deviations from Kafka (replication factor and assignments accepted but not used) are
listed in ``broker.topics``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from protocol.errors import ErrorCode, KafkaProtocolError

MAX_PARTITIONS = 10_000
MAX_REPLICATION_FACTOR = 3
_NAME_RE = re.compile(r"[a-zA-Z0-9._-]{1,249}")


def validate_topic_name(name: str) -> None:
    """Kafka's rules: 1-249 of ``[a-zA-Z0-9._-]``, and not ``.`` or ``..``."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or name in (".", ".."):
        raise KafkaProtocolError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"invalid topic name {str(name)[:300]!r}: 1-249 characters of [a-zA-Z0-9._-], "
            "not '.' or '..'",
        )


def is_valid_topic_name(name: str) -> bool:
    try:
        validate_topic_name(name)
    except KafkaProtocolError:
        return False
    return True


def validate_partitions(partitions: int) -> None:
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise KafkaProtocolError(
            ErrorCode.INVALID_PARTITIONS,
            f"number of partitions must be in [1, {MAX_PARTITIONS}], got {partitions}",
        )


def validate_replication_factor(factor: int) -> None:
    if factor != -1 and not 1 <= factor <= MAX_REPLICATION_FACTOR:
        raise KafkaProtocolError(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"replication factor must be -1 or in [1, {MAX_REPLICATION_FACTOR}], got {factor} "
            "(durability comes from the object store)",
        )


def check_assignments(assignments: Mapping[int, Sequence[int]], first: int) -> int:
    """Validate manual replica assignments; returns the number of partitions they name."""
    indexes = sorted(assignments)
    if indexes != list(range(first, first + len(indexes))):
        raise KafkaProtocolError(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT, "partition indexes must be consecutive from 0"
        )
    for index, brokers in assignments.items():
        if not 1 <= len(brokers) <= MAX_REPLICATION_FACTOR or len(set(brokers)) != len(brokers):
            raise KafkaProtocolError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"partition {index}: 1-{MAX_REPLICATION_FACTOR} distinct brokers needed",
            )
    return len(indexes)
