"""The state of one transactional id, as stored at ``/txn/{tid}/state`` (its JSON codec
is here, like ``groupcoord.GroupRecord``'s; the keys are in ``broker/meta/schema.py``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from enum import StrEnum


class TxnState(StrEnum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"

    @property
    def preparing(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)


@dataclass(frozen=True, slots=True)
class TxnRecord:
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    # the epoch before the last bump (KIP-360: a producer retrying with it is recognised)
    last_producer_epoch: int = -1
    partitions: frozenset[tuple[str, int]] = field(default_factory=frozenset)
    groups: frozenset[str] = field(default_factory=frozenset)
    started_ms: int = -1  # when the ongoing transaction began (-1: none)
    updated_ms: int = -1

    def with_(self, **changes: object) -> TxnRecord:
        return replace(self, **changes)  # type: ignore[arg-type]

    def to_json(self) -> bytes:
        d = {
            "pid": self.producer_id,
            "epoch": self.producer_epoch,
            "last_epoch": self.last_producer_epoch,
            "timeout_ms": self.timeout_ms,
            "state": self.state.value,
            "partitions": sorted([t, p] for t, p in self.partitions),
            "groups": sorted(self.groups),
            "started_ms": self.started_ms,
            "updated_ms": self.updated_ms,
        }
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, value: bytes) -> TxnRecord:
        d = json.loads(value)
        return cls(
            producer_id=int(d["pid"]),
            producer_epoch=int(d["epoch"]),
            timeout_ms=int(d["timeout_ms"]),
            state=TxnState(d["state"]),
            last_producer_epoch=int(d.get("last_epoch", -1)),
            partitions=frozenset((str(t), int(p)) for t, p in d.get("partitions", [])),
            groups=frozenset(str(g) for g in d.get("groups", [])),
            started_ms=int(d.get("started_ms", -1)),
            updated_ms=int(d.get("updated_ms", -1)),
        )
