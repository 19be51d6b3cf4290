"""The transaction coordinator's state machine: pure, no I/O (docs/architecture.md,
"Transactions"). ``broker.txn_coordinator`` runs it over the metadata store."""

from txncoord.machine import (
    Decision,
    add_groups,
    add_partitions,
    completed,
    end_txn,
    init_producer,
    timed_out,
)
from txncoord.model import TxnRecord, TxnState

__all__ = [
    "Decision",
    "TxnRecord",
    "TxnState",
    "add_groups",
    "add_partitions",
    "completed",
    "end_txn",
    "init_producer",
    "timed_out",
]
