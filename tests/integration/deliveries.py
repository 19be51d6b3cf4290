"""What a librdkafka delivery report acknowledged, and which of it a log lacks.

librdkafka reports a successful delivery without an offset when it never got the
answer to a batch but a later batch of the same idempotent producer succeeded: the
broker's sequence checks prove the earlier batch stored. Such a record is kept with
offset -1 and must be present in its partition, at any offset; every other acknowledged
record must be at the offset its report gave."""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import Message

NO_OFFSET = -1


def acked_at(msg: Message) -> tuple[int, int]:
    """(partition, offset) of a successful delivery report (offset -1: none given)."""
    offset = msg.offset()
    return msg.partition() or 0, NO_OFFSET if offset is None else offset


def missing(
    acked: Mapping[bytes, tuple[int, int]], found: Mapping[bytes, tuple[int, int]]
) -> dict[bytes, tuple[tuple[int, int], tuple[int, int] | None]]:
    """Acknowledged records not where their reports put them: record -> (acknowledged
    (partition, offset), found (partition, offset) or None)."""
    out: dict[bytes, tuple[tuple[int, int], tuple[int, int] | None]] = {}
    for value, (part, offset) in acked.items():
        at = found.get(value)
        if at is None or at[0] != part or (offset != NO_OFFSET and at[1] != offset):
            out[value] = ((part, offset), at)
    return out
