"""Metadata keys and value codecs of partition logs (docs/format.md, "Metadata keys").

Imports nothing from the server: the broker, maintenance, the CLI and tools build and
parse these keys and values here and nowhere else.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass


def end_key(topic: str, partition: int) -> str:
    return f"/logs/{topic}/{partition}/end"


def owner_key(topic: str, partition: int) -> str:
    return f"/owners/{topic}/{partition}"


def segments_prefix(topic: str, partition: int) -> str:
    return f"/logs/{topic}/{partition}/segments/"


def seg_entry_key(topic: str, partition: int, base: int) -> str:
    return f"{segments_prefix(topic, partition)}{base:020d}"


def epochs_prefix(topic: str, partition: int) -> str:
    return f"/logs/{topic}/{partition}/epochs/"


def epoch_key(topic: str, partition: int, epoch: int) -> str:
    return f"{epochs_prefix(topic, partition)}{epoch:010d}"


def entry_base(key: str) -> int:
    """The base offset (or epoch) that ends a ``segments/`` or ``epochs/`` key."""
    return int(key.rsplit("/", 1)[-1])


@dataclass(frozen=True, slots=True)
class EndValue:
    """``/logs/{t}/{p}/end``: the committed log end, the owner epoch, the log start."""

    next_offset: int
    epoch: int
    log_start: int = 0

    def encode(self) -> bytes:
        return end_json(self.next_offset, self.epoch, self.log_start)

    @classmethod
    def decode(cls, value: bytes) -> EndValue:
        d = json.loads(value)
        return cls(int(d["next_offset"]), int(d["epoch"]), int(d.get("log_start", 0)))


def end_json(next_offset: int, epoch: int, log_start: int) -> bytes:
    """The value of ``/logs/{t}/{p}/end`` (``log_start``: docs/format.md, log start)."""
    return json.dumps(
        {"next_offset": next_offset, "epoch": epoch, "log_start": log_start},
        separators=(",", ":"),
    ).encode()


def owner_value(broker: int, epoch: int, topic_id: uuid.UUID) -> bytes:
    """The value of ``/owners/{t}/{p}``. The topic id makes it unique across incarnations
    of a topic name (a re-created topic restarts at epoch 1), so a compare on it never
    mistakes a new incarnation's owner for the old one's."""
    return json.dumps(
        {"broker": broker, "epoch": epoch, "topic_id": str(topic_id)}, separators=(",", ":")
    ).encode()


def owner_broker(value: bytes) -> int | None:
    """The broker id in an owner value (None when unreadable)."""
    try:
        return int(json.loads(value)["broker"])
    except (ValueError, KeyError, TypeError):
        return None
