"""Manifest transactions of owned partitions: one guard, and commits of unknown outcome.

Every transaction that changes a partition's manifest (a flush commit, a merge, a head
truncation) is guarded the same way: the owner key still holds this owner's value
(broker, epoch, topic id) and the end key still has the mod revision this owner last
wrote or read. ``Committer`` builds that guard once, serializes this broker's manifest
transactions (``lock``), and settles the outcome of a transaction that the metadata store
could not confirm (a deadline exceeded, a dropped connection, a leader change): such a
transaction may still have been applied, or may still be applied later.

Resolution (docs/format.md, "Commits of unknown outcome"): one more transaction with the
same guard. If the guard holds, it reads the keys the first one wrote (``probes``) and
rewrites every end key with the value it already has, which moves its mod revision: the
first transaction, if it was never applied, can now never be. If the guard fails, it
reads the probes, the end keys and the owner keys instead. Either way the probes say
whether the first transaction was applied, and the answer is final. When the store
cannot be reached for ``resolve_s`` seconds the outcome stays unknown: the caller then
fails its producers with a retriable error, deletes nothing, and drops the partition so
that the next owner (or this broker, taking it again) starts from what the store holds.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from broker.meta.base import (
    Compare,
    Delete,
    Get,
    KeyValue,
    MetaStore,
    MetaStoreError,
    Put,
    TxnResult,
)
from broker.meta.schema import (
    end_key,
    entry_base,
    owner_key,
    partition_logs_prefix,
    segments_prefix,
)
from broker.partition import CLOSED, PartitionLog

log = logging.getLogger(__name__)

RETRY_FIRST_S = 0.05
RETRY_MAX_S = 1.0


class Outcome(enum.Enum):
    COMMITTED = "committed"
    REJECTED = "rejected"  # certainly not applied, and never will be
    UNKNOWN = "unknown"  # the store could not be asked: maybe applied, maybe later


@dataclass(frozen=True, slots=True)
class CommitResult:
    outcome: Outcome
    revision: int = 0
    # logs whose ownership is gone (another owner took over): close them, delete nothing
    fenced: tuple[PartitionLog, ...] = ()
    # settled by a read-back after the store failed to answer the transaction itself
    resolved: bool = False


class Committer:
    """Guarded manifest transactions for the partitions this broker owns."""

    def __init__(self, meta: MetaStore, resolve_s: float) -> None:
        self.meta = meta
        self.resolve_s = resolve_s
        # serializes manifest transactions: flush commits and maintenance (merge,
        # retention, DeleteRecords) compare the same end revisions
        self.lock = asyncio.Lock()
        self.stats = {"ambiguous": 0, "resolved": 0, "unresolved": 0}
        # folds the cycle-key entries of logs before any other guarded transaction of
        # theirs that needs them in their own keys (broker/fold.py); called holding
        # ``fold_lock``, which every guarded transaction holds: a fold moves the end
        # revisions the others compare (cycle commits take neither lock)
        self.settle: Callable[[Sequence[PartitionLog]], Awaitable[None]] | None = None
        self.fold_lock = asyncio.Lock()

    @staticmethod
    def guard(lg: PartitionLog) -> list[Compare]:
        return [
            Committer.owner_guard(lg),
            Compare(end_key(lg.topic, lg.partition), "mod_revision", "==", lg.end_rev),
        ]

    @staticmethod
    def owner_guard(lg: PartitionLog) -> Compare:
        return Compare(owner_key(lg.topic, lg.partition), "value", "==", lg.owner_value)

    async def owns(self, lg: PartitionLog) -> bool:
        """Whether the owner key still holds ``lg``'s owner value (asked of the store)."""
        res = await self.meta.txn([self.owner_guard(lg)], [])
        return res.succeeded

    async def commit(
        self,
        lgs: Sequence[PartitionLog],
        ops: Sequence[Put | Delete],
        probes: Mapping[str, bytes],
        *,
        moves_end: bool,
        settle: bool = True,
    ) -> CommitResult:
        """Run ``ops`` under the guard of every log in ``lgs``.

        ``probes``: keys that ``ops`` put, with their values, unique to this transaction
        (a manifest entry naming a fresh object, an end value); ``moves_end``: whether
        ``ops`` rewrite the end keys (then a commit moves their revision to its own).
        The caller updates in-memory state; this updates only ``end_rev`` during a
        resolution. ``settle``: fold the logs' cycle-key entries first when ``ops`` move
        the end or touch entries past the folded end (a merge of folded segments needs
        no fold; the fold itself passes False); a log dropped by its fold rejects the
        transaction, unsent.

        The caller holds ``lock``: the logs' state cannot move between building ``ops``
        and sending them, and an end value in ``ops`` is built from ``hw`` (which the
        fold makes the folded end)."""
        if not settle:  # a fold: its caller holds the fold lock
            return await self._commit(lgs, ops, probes, moves_end)
        async with self.fold_lock:
            behind = [lg for lg in lgs if lg.unfolded and (moves_end or _touches_tail(lg, ops))]
            if behind and self.settle is not None:
                await self.settle(behind)
                closed = tuple(lg for lg in lgs if lg.state == CLOSED)
                if closed or any(lg.unfolded for lg in behind):  # not folded: not sent
                    return CommitResult(Outcome.REJECTED, 0, closed, resolved=True)
            return await self._commit(lgs, ops, probes, moves_end)

    async def _commit(
        self,
        lgs: Sequence[PartitionLog],
        ops: Sequence[Put | Delete],
        probes: Mapping[str, bytes],
        moves_end: bool,
    ) -> CommitResult:
        compares = [c for lg in lgs for c in self.guard(lg)]
        try:
            res = await self.meta.txn(compares, ops)
        except MetaStoreError as exc:
            self.stats["ambiguous"] += 1
            log.warning(
                "manifest commit of %s outcome unknown (%s); resolving",
                _names(lgs),
                exc,
            )
            return await self._resolve(lgs, probes, moves_end)
        if res.succeeded:
            return CommitResult(Outcome.COMMITTED, res.revision)
        return CommitResult(Outcome.REJECTED)

    async def _resolve(
        self, lgs: Sequence[PartitionLog], probes: Mapping[str, bytes], moves_end: bool
    ) -> CommitResult:
        """Settle an unknown outcome, in as many transactions as the store's operation
        limit needs (a resolution reads three keys per partition): each group of
        partitions with its own probes. The first transaction was atomic, so the groups'
        answers agree: one whose guard holds makes the first transaction impossible for
        all (its revisions moved), and one that finds its probes proves it applied."""
        per = max(1, self.meta.max_txn_ops // 3)
        if len(lgs) <= per and len(probes) + 2 * len(lgs) <= self.meta.max_txn_ops:
            return await self._resolve_group(lgs, probes, moves_end)
        results = []
        for i in range(0, len(lgs), per):
            group = lgs[i : i + per]
            mine = _probes_of(group, probes, self.meta.max_txn_ops - 2 * len(group))
            results.append(await self._resolve_group(group, mine, moves_end))
        return _combine(results)

    async def _resolve_group(
        self, lgs: Sequence[PartitionLog], probes: Mapping[str, bytes], moves_end: bool
    ) -> CommitResult:
        res = await self._resolving_txn(lgs, list(probes))
        if res is None:
            return CommitResult(Outcome.UNKNOWN)
        self.stats["resolved"] += 1
        n_probes = len(probes)
        found = res.gets[:n_probes]
        # one probe holding its value proves the (atomic) transaction applied; another may
        # be gone since, merged away by a new owner of its partition
        proofs = [
            g[0].mod_revision
            for g, value in zip(found, probes.values(), strict=True)
            if g and g[0].value == value
        ]
        applied = bool(proofs)
        if res.succeeded:  # the guard held; every end revision has just moved
            for lg in lgs:
                lg.end_rev = res.revision
            outcome = Outcome.COMMITTED if applied and not moves_end else Outcome.REJECTED
            _log_outcome(lgs, outcome)
            return CommitResult(outcome, res.revision, resolved=True)
        n = len(lgs)
        ends, owners = res.gets[n_probes : n_probes + n], res.gets[n_probes + n :]
        revision = proofs[0] if applied else 0
        fenced = _fenced(lgs, ends, owners, revision if applied and moves_end else None)
        outcome = Outcome.COMMITTED if applied else Outcome.REJECTED
        _log_outcome(lgs, outcome)
        return CommitResult(outcome, revision, fenced, resolved=True)

    async def _resolving_txn(
        self, lgs: Sequence[PartitionLog], probe_keys: Sequence[str]
    ) -> TxnResult | None:
        """The resolution's one transaction, retried with back-off until ``resolve_s``:
        under the partitions' guards it rewrites their ends (so that the first
        transaction can no longer apply), else it reads their ends and owners; the
        probes are read either way. None when the store did not answer in time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.resolve_s
        delay = RETRY_FIRST_S
        gets = [Get(k) for k in probe_keys]
        while True:
            try:
                return await self.meta.txn(
                    [c for lg in lgs for c in self.guard(lg)],
                    [*gets, *(Put(end_key(lg.topic, lg.partition), lg.end_value()) for lg in lgs)],
                    [
                        *gets,
                        *(Get(end_key(lg.topic, lg.partition)) for lg in lgs),
                        *(Get(owner_key(lg.topic, lg.partition)) for lg in lgs),
                    ],
                )
            except MetaStoreError as exc:
                if loop.time() + delay >= deadline:
                    self.stats["unresolved"] += 1
                    log.warning(
                        "manifest commit of %s: outcome still unknown (%s)", _names(lgs), exc
                    )
                    return None
                await asyncio.sleep(delay)  # back-off between attempts, not a state wait
                delay = min(delay * 2, RETRY_MAX_S)


def _fenced(
    lgs: Sequence[PartitionLog],
    ends: Sequence[Sequence[KeyValue]],
    owners: Sequence[Sequence[KeyValue]],
    commit_revision: int | None,
) -> tuple[PartitionLog, ...]:
    """The partitions a resolution whose guard failed finds no longer this broker's: its
    owner value gone or changed, its end gone, or its end moved by another writer. An end
    at ``commit_revision`` (the proven commit moved it: the caller records that
    revision) or at the log's own revision is this broker's; one holding the log's own
    end value was rewritten by an earlier resolution attempt, whose revision is taken."""
    fenced = []
    for lg, end, owner in zip(lgs, ends, owners, strict=True):
        if not owner or owner[0].value != lg.owner_value or not end:
            fenced.append(lg)
        elif commit_revision is not None and end[0].mod_revision == commit_revision:
            continue
        elif end[0].mod_revision == lg.end_rev:
            continue
        elif end[0].value == lg.end_value():
            lg.end_rev = end[0].mod_revision  # an earlier resolution attempt's rewrite
        else:
            fenced.append(lg)
    return tuple(fenced)


def _touches_tail(lg: PartitionLog, ops: Sequence[Put | Delete]) -> bool:
    """Whether ``ops`` put or delete a manifest entry of ``lg`` at or past its folded end."""
    prefix = segments_prefix(lg.topic, lg.partition)
    return any(op.key.startswith(prefix) and entry_base(op.key) >= lg.folded for op in ops)


def _probes_of(
    lgs: Sequence[PartitionLog], probes: Mapping[str, bytes], limit: int
) -> dict[str, bytes]:
    """The probes under ``lgs``' partitions, at most ``limit`` (one present probe of an
    atomic transaction proves it applied)."""
    prefixes = tuple(partition_logs_prefix(lg.topic, lg.partition) for lg in lgs)
    mine = {k: v for k, v in probes.items() if k.startswith(prefixes)}
    return dict(list(mine.items())[: max(1, limit)])


def _combine(results: Sequence[CommitResult]) -> CommitResult:
    """One outcome from the groups of a resolution: committed if any group proved it,
    else unknown if any group could not ask, else rejected."""
    fenced = tuple(lg for r in results for lg in r.fenced)
    for r in results:
        if r.outcome is Outcome.COMMITTED:
            return CommitResult(Outcome.COMMITTED, r.revision, fenced, resolved=True)
    if any(r.outcome is Outcome.UNKNOWN for r in results):
        return CommitResult(Outcome.UNKNOWN)
    return CommitResult(Outcome.REJECTED, 0, fenced, resolved=True)


def _names(lgs: Sequence[PartitionLog]) -> str:
    shown = ", ".join(f"{lg.topic}-{lg.partition}" for lg in lgs[:4])
    return shown + (f" (+{len(lgs) - 4} more)" if len(lgs) > 4 else "")


def _log_outcome(lgs: Sequence[PartitionLog], outcome: Outcome) -> None:
    log.warning("manifest commit of %s resolved: %s", _names(lgs), outcome.value)
