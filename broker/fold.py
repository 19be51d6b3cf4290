"""Cycle keys: a flush cycle of many partitions committed as ONE metadata key, folded later.

With ``--cycle-keys-min-partitions N`` (0: off), a flush cycle of at least N partitions
commits one transaction whatever its partition count (etcd allows 128 operations per
transaction; per partition the cycle would need two compares and two puts):

* compare ``/brokers/{id}``'s create revision with this broker's registration (its
  lease alive: every owner key it holds is alive, docs/architecture.md "Cycle keys"),
* compare the new key ``/cycles/{id}/{reg}/{seq}`` absent, and put it: every segment of
  the cycle with its partition, topic id and owner epoch (``broker.meta.schema``).

The appends are acknowledged when it commits. The owner then **folds** the entries into
each partition's own keys (manifest entry, end) with the usual guarded transactions,
every ``FOLD_INTERVAL_S`` or once ``FOLD_AT_KEYS`` keys wait, before any other guarded
transaction of the partition (``Committer.commit``'s hook), and at a hand-off; a key
whose entries are all folded is deleted. A partition dropped before its fold leaves its
entries in the keys: its next owner folds them at its take (``broker/cycles.py``).

A cycle commit whose outcome the store cannot confirm is settled by putting an *aborted*
tombstone under the same key (the original compares the key absent, so only one of the
two can ever be applied): finding the original there means committed, putting the
tombstone means never. Tombstones and keys left by dropped partitions are deleted once
every entry is settled (``broker.cycles.entry_settled``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from broker import faults
from broker.commit import CommitResult, Outcome
from broker.cycles import ChainError, entries_of, entry_settled
from broker.meta.base import Compare, Delete, Get, KeyValue, MetaStoreError, Put
from broker.meta.schema import (
    CYCLES_PREFIX,
    CycleEntry,
    SegmentMeta,
    broker_key,
    cycle_json,
    cycle_key,
    cycle_key_owner,
    cycles_prefix,
    end_key,
    parse_cycle,
    seg_entry_key,
    topic_key,
)
from broker.partition import CLOSED, PartitionLog
from broker.tasks import cancel_and_wait

if TYPE_CHECKING:
    from broker.logs import LogManager

log = logging.getLogger(__name__)

# a fold puts each entry once and each partition's end once (up to 127 puts per
# transaction): folding seldom saves end puts and compares, and keeps a take's chain short
FOLD_INTERVAL_S = 5.0
FOLD_AT_KEYS = 64  # keys waiting for their fold: fold now
LEFTOVER_CHECK_S = 60.0  # a key whose partition nobody takes stays unsettled: checked seldom
RESOLVE_RETRY_S = 0.1


class Folder:
    """Cycle commits and folds of the partitions this broker owns (one per LogManager)."""

    def __init__(self, logs: LogManager) -> None:
        self.logs = logs
        self.config = logs.config
        # own cycle keys -> the logs with entries in them not folded yet
        self.keys: dict[str, set[PartitionLog]] = {}
        # own keys no log of this broker will fold (dropped, aborted), checked for settled
        self.leftovers: set[str] = set()
        self._deletable: list[str] = []
        self._seq = 0
        self.lock = logs.committer.fold_lock
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_leftover_check = 0.0
        self._broken: set[str] = set()  # keys that do not decode: reported once, kept
        self.stats = {
            "cycle_txns": 0, "folds": 0, "fold_txns": 0, "folded_segments": 0,
            "keys_deleted": 0, "aborted": 0,
        }  # fmt: skip

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="cycle-fold")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    def enabled(self, lgs: Sequence[PartitionLog]) -> bool:
        """Whether a cycle of ``lgs`` commits as a cycle key: on, enough partitions (or
        one waiting for a fold already), and every one taken under this broker's current
        registration (so its end names it)."""
        n = self.config.cycle_keys_min_partitions
        reg = self.logs.cluster.reg
        if n <= 0 or reg <= 0 or not all(lg.owner_reg == reg for lg in lgs):
            return False
        # a smaller cycle too while any of its logs waits for a fold: committed per
        # partition, it would need that fold first (a second transaction)
        return len(lgs) >= n or any(lg.unfolded for lg in lgs)

    # -- the commit -----------------------------------------------------------------------
    async def commit_cycle(
        self, segs: Sequence[tuple[PartitionLog, SegmentMeta]]
    ) -> tuple[CommitResult, str]:
        """Commit one cycle key naming ``segs`` (the caller holds the commit lock and
        updates the logs); its outcome and the key. REJECTED: never applied, because the
        registration is gone (not ``resolved``: the logs are fenced) or a tombstone now
        holds the key (``resolved``)."""
        reg = self.logs.cluster.reg
        self._seq += 1
        key = cycle_key(self.config.node_id, reg, self._seq)
        entries = [
            CycleEntry(lg.topic, lg.partition, lg.topic_hex, lg.epoch, seg) for lg, seg in segs
        ]
        fence = [
            Compare(broker_key(self.config.node_id), "create_revision", "==", reg),
            Compare(key, "create_revision", "==", 0),
        ]
        self.stats["cycle_txns"] += 1
        faults.checkpoint("cycle.before_commit")
        try:
            res = await self.logs.meta.txn(fence, [Put(key, cycle_json(entries))])
        except MetaStoreError as exc:
            log.warning("cycle commit %s outcome unknown (%s); resolving", key, exc)
            outcome = await self._resolve(key, entries)
            if outcome is Outcome.UNKNOWN:  # maybe there, maybe later: checked as a leftover
                self.leftovers.add(key)
            return CommitResult(outcome, resolved=outcome is not Outcome.UNKNOWN), key
        if res.succeeded:
            return CommitResult(Outcome.COMMITTED, res.revision), key
        return CommitResult(Outcome.REJECTED), key

    async def _resolve(self, key: str, entries: list[CycleEntry]) -> Outcome:
        """Put the aborted tombstone unless the original is there (see the module doc)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.logs.committer.resolve_s
        while True:
            try:
                res = await self.logs.meta.txn(
                    [Compare(key, "create_revision", "==", 0)],
                    [Put(key, cycle_json(entries, aborted=True))],
                    [Get(key)],
                )
                break
            except MetaStoreError as exc:
                if loop.time() + RESOLVE_RETRY_S >= deadline:
                    log.warning("cycle commit %s: outcome still unknown (%s)", key, exc)
                    return Outcome.UNKNOWN
                await asyncio.sleep(RESOLVE_RETRY_S)  # back-off between attempts
        # the key is there: the original, or the tombstone of an earlier attempt of this
        # resolution that was applied and reported failed
        if res.succeeded or (res.gets[0] and parse_cycle(res.gets[0][0].value)[0]):
            self.stats["aborted"] += 1
            self.leftovers.add(key)
            log.warning("cycle commit %s resolved: rejected (tombstone put)", key)
            return Outcome.REJECTED
        log.warning("cycle commit %s resolved: committed", key)
        return Outcome.COMMITTED

    def committed(self, key: str, lgs: Sequence[PartitionLog]) -> None:
        self.keys[key] = set(lgs)
        if len(self.keys) >= FOLD_AT_KEYS:
            self._wake.set()

    # -- folding --------------------------------------------------------------------------
    async def fold(self, lgs: Sequence[PartitionLog]) -> None:
        """Fold every unfolded segment of ``lgs`` into their own keys. A log whose fold
        fails is dropped: its entries stay in the cycle keys for its next owner.

        Folds hold the fold lock, not the commit lock: cycle commits go on meanwhile
        (they only append to ``unfolded`` and touch no partition key). A caller of the
        commit lock takes this one inside it, never the other way round."""
        async with self.lock:
            await self.fold_held(lgs)

    async def fold_held(self, lgs: Sequence[PartitionLog]) -> None:
        """``fold`` for a caller that holds the fold lock (``Committer.commit``'s hook)."""
        todo = [lg for lg in lgs if lg.unfolded and lg.state != CLOSED]
        limit = self.logs.meta.max_txn_ops
        while todo:
            group: list[tuple[PartitionLog, int]] = []
            puts = 0
            for lg in todo:
                n = min(len(lg.unfolded), limit - 1)
                if group and (puts + n + 1 > limit or 2 * (len(group) + 1) > limit):
                    break
                group.append((lg, n))
                puts += n + 1
            moved = await self._fold_group(group)
            tried = {lg for lg, _n in group}
            todo = [
                lg
                for lg in todo
                if lg.unfolded and lg.state != CLOSED and (lg in moved or lg not in tried)
            ]
        self.stats["folds"] += 1

    async def _fold_group(self, group: list[tuple[PartitionLog, int]]) -> set[PartitionLog]:
        """One fold transaction; the logs it folded (a log certainly not folded, but
        not fenced either, stays as it is: the next fold tries again)."""
        ops: list[Put | Delete] = []
        probes: dict[str, bytes] = {}
        for lg, n in group:
            segs = [s for s, _k in lg.unfolded[:n]]
            puts = [Put(seg_entry_key(lg.topic, lg.partition, s.base), s.to_json()) for s in segs]
            ops += puts
            probes[puts[0].key] = puts[0].value  # a fresh object's entry: unique
            ops.append(Put(end_key(lg.topic, lg.partition), lg.end_at(segs[-1].last + 1)))
        lgs = [lg for lg, _n in group]
        self.stats["fold_txns"] += 1
        faults.checkpoint("fold.before_commit")
        res = await self.logs.committer.commit(lgs, ops, probes, moves_end=True, settle=False)
        if res.outcome is Outcome.REJECTED and not res.resolved and len(group) > 1:
            moved: set[PartitionLog] = set()
            for item in group:  # find which partition's guard failed
                moved |= await self._fold_group([item])
            return moved
        if res.outcome is not Outcome.COMMITTED:
            unknown = res.outcome is Outcome.UNKNOWN
            lost = lgs if unknown or not res.resolved else list(res.fenced)
            why = "a fold had an unknown outcome" if unknown else "fenced"
            for lg in lost:
                self.logs.drop(lg, f"{why} (its cycle entries are left to its next owner)")
            return set()
        for lg, n in group:
            keys = {k for _s, k in lg.unfolded[:n]}
            lg.folded_upto(n, res.revision)
            self.stats["folded_segments"] += n
            still = {k for _s, k in lg.unfolded}
            for key in keys - still:
                waiting = self.keys.get(key)
                if waiting is not None:
                    waiting.discard(lg)
                    if not waiting:
                        del self.keys[key]
                        self._deletable.append(key)
        for lg in res.fenced:
            self.logs.drop(lg, "fenced after a fold")
        return set(lgs)

    async def fold_all(self) -> None:
        """One fold of every owned log with unfolded segments, then the deletions due."""
        lgs = [lg for lg in self.logs.logs.values() if lg.unfolded]
        if lgs:
            await self.fold(lgs)
        await self._delete_folded()

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        await self._check_own_keys()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FOLD_INTERVAL_S):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.fold_all()
                self._collect_dropped()
                if loop.time() - self._last_leftover_check >= LEFTOVER_CHECK_S:
                    self._last_leftover_check = loop.time()
                    await self._check_own_keys()
                    if self.leftovers:
                        await self._check_leftovers(sorted(self.leftovers))
                    if self._controls():
                        await self._check_gone_nodes()
            except MetaStoreError as exc:
                log.warning("cycle fold: %s (retried)", exc)
            except Exception:  # never let the fold loop die
                log.exception("cycle fold failed")

    # -- deleting keys --------------------------------------------------------------------
    async def _delete_folded(self) -> None:
        while self._deletable:
            chunk = self._deletable[: self.logs.meta.max_txn_ops]
            await self.logs.meta.txn([], [Delete(k) for k in chunk])
            del self._deletable[: len(chunk)]
            self.stats["keys_deleted"] += len(chunk)

    def _collect_dropped(self) -> None:
        """Keys still waiting only on logs this broker no longer serves: leftovers."""
        for key, waiting in list(self.keys.items()):
            if all(lg.state == CLOSED for lg in waiting):
                del self.keys[key]
                self.leftovers.add(key)

    async def _check_own_keys(self) -> None:
        """This node id's keys that no log of this broker will fold become leftovers:
        an earlier registration's (a restart, a lost lease), or one of this registration
        that nothing here tracks (a commit reported of unknown outcome whose original
        landed after its resolution gave up). A key committed meanwhile may be taken for
        one too: its entries are not settled until its fold, which deletes it."""
        prefix = cycles_prefix(self.config.node_id)
        try:
            kvs = await self.logs.meta.range(prefix)
        except MetaStoreError as exc:
            log.warning("own cycle keys not checked: %s", exc)
            return
        tracked = self.keys.keys() | set(self._deletable) | self._broken
        self.leftovers.update(kv.key for kv in kvs if kv.key not in tracked)

    async def _check_leftovers(self, keys: list[str]) -> None:
        """Delete the leftover keys whose every entry is settled."""
        for key in keys:
            kv = await self.logs.meta.get(key)
            done = True if kv is None else await self._delete_if_settled(kv)
            if done is None:
                self._broken.add(key)  # not listed again by _check_own_keys
            if done is not False:
                self.leftovers.discard(key)

    def _controls(self) -> bool:
        cluster = self.logs.cluster
        return cluster.controller_id() == self.config.node_id and cluster.lease_valid()

    async def _check_gone_nodes(self) -> None:
        """The controller's part of the clean-up: the keys of node ids with no live
        registration, deleted once every entry is settled. A node id that registers
        again checks its own earlier keys (``_check_own_keys``); one that never
        does (a scaled-down pod) had its keys kept for good before. Settled is final, so a
        node registering again meanwhile changes nothing."""
        meta = self.logs.meta
        kvs = [
            (owner[0], kv)
            for kv in await meta.range(CYCLES_PREFIX)
            if (owner := cycle_key_owner(kv.key)) is not None and owner[0] != self.config.node_id
        ]
        nodes = sorted({node for node, _kv in kvs})
        live: set[int] = set()
        for i in range(0, len(nodes), meta.max_txn_ops):
            chunk = nodes[i : i + meta.max_txn_ops]
            res = await meta.txn([], [Get(broker_key(n)) for n in chunk])
            live.update(n for n, got in zip(chunk, res.gets, strict=True) if got)
        for node, kv in kvs:
            if node not in live and kv.key not in self._broken:
                if await self._delete_if_settled(kv) is None:
                    self._broken.add(kv.key)  # reported once

    async def _delete_if_settled(self, kv: KeyValue) -> bool | None:
        """Delete the cycle key ``kv`` if every entry of it is settled (unless it changed
        since): whether it was; None for a key that does not decode (kept in the store for
        an operator, one error line)."""
        try:
            entries = entries_of([kv])
        except ChainError as exc:
            log.error("cycle key %s left alone: %s", kv.key, exc)
            return None
        if not await self._settled(entries):
            return False
        compare = Compare(kv.key, "mod_revision", "==", kv.mod_revision)
        await self.logs.meta.txn([compare], [Delete(kv.key)])
        self.stats["keys_deleted"] += 1
        return True

    async def _settled(self, entries: list[CycleEntry]) -> bool:
        per = max(1, self.logs.meta.max_txn_ops // 2)
        for i in range(0, len(entries), per):
            chunk = entries[i : i + per]
            gets = [
                g
                for e in chunk
                for g in (Get(topic_key(e.topic)), Get(end_key(e.topic, e.partition)))
            ]
            res = await self.logs.meta.txn([], gets)
            for j, e in enumerate(chunk):
                topic, end = _one(res.gets[2 * j]), _one(res.gets[2 * j + 1])
                if not entry_settled(e, topic, end):
                    return False
        return True


def _one(kvs: Sequence[KeyValue]) -> KeyValue | None:
    return kvs[0] if kvs else None
