"""Deleting segment objects: the one service through which objects of a log are removed.

The rules (docs/format.md, "Object keys" and "Deleting objects"), which together mean no
broker ever deletes an object that a manifest entry references or may yet reference:

- Object names are writer-unique: they carry the writer's ownership epoch, the topic
  incarnation and a per-writer number, so no two owners ever write, or delete, the same
  key, and an object's writer is known from its name.
- **Retirement**: objects that this owner's own committed transaction removed from the
  manifest (a merge, retention, DeleteRecords) are deleted ``segment_delete_grace_ms``
  later (a reader may still hold the old entry), and only while this broker still holds
  the partition, confirmed in the metadata store just before the delete. Otherwise they
  are left to the next owner's sweep.
- **Sweeps**: a new owner, one grace period after taking a partition, deletes the objects
  that no manifest entry names. It lists the objects first, then reads the manifest
  fresh in a transaction guarded by its owner value (a fenced sweeper deletes nothing),
  and deletes only objects (a) older than the grace period by the object's own creation
  time, and (b) written under a lower epoch of this topic incarnation, or by an earlier
  incarnation, or under a legacy name. An object of a lower epoch that the manifest does
  not name can never be named again: its writer was fenced when this owner took over.
- **Shared objects** (docs/format.md, "Shared objects") are never deleted here: a
  retired range only leaves the cache; the shared sweep (``broker.shared_sweep``) deletes
  the object once no entry names any of its segments and none can any more.
- **Topic deletion** removes every object under the topic's prefix except those whose
  names carry another topic id: a topic re-created under the name keeps what it writes
  (``topic_garbage``).
- An object whose commit outcome is unknown is never deleted by its writer; a later owner
  sweeps it if it was not committed.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from broker import faults
from broker.meta.base import Get, MetaStoreError
from broker.meta.schema import entry_base, segments_prefix
from broker.partition import ACTIVE, PartitionLog, SegmentMeta
from segments.format import index_key_for, parse_object_name, partition_prefix, topic_tag
from segments.shared import is_range_key
from segments.store import ObjectInfo, ObjectStore, StoreError

if TYPE_CHECKING:
    from broker.logs import LogManager

log = logging.getLogger(__name__)


def topic_garbage(objects: Sequence[ObjectInfo], prefix: str, topic_id: uuid.UUID) -> list[str]:
    """Keys among ``objects`` (listed under a deleted topic's ``prefix``) to delete: all
    but the writer-unique names of another incarnation of the topic (one re-created under
    the name meanwhile; its names carry its own topic id)."""
    tag = topic_tag(topic_id)
    out = []
    for info in objects:
        if not info.key.startswith(prefix):
            continue
        name = parse_object_name(info.key.rsplit("/", 1)[-1])
        if name is not None and name.topic_tag not in ("", tag):
            continue
        out.append(info.key)
    return out


class ObjectDeleter:
    """Retirement and sweeps of the objects of the logs this broker owns."""

    def __init__(self, logs: LogManager) -> None:
        self.logs = logs
        self.config = logs.config
        # object key -> (deletion timer, the log whose transaction retired it)
        self._pending: dict[str, tuple[asyncio.TimerHandle, PartitionLog]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.stats = {"deleted": 0, "swept": 0}

    @property
    def pending(self) -> frozenset[str]:
        return frozenset(self._pending)

    def _current(self, lg: PartitionLog) -> bool:
        return lg.state == ACTIVE and self.logs.logs.get((lg.topic, lg.partition)) is lg

    async def stop(self) -> None:
        """Cancel scheduled deletions (left to the next owner's sweep)."""
        for handle, _lg in self._pending.values():
            handle.cancel()
        self._pending.clear()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks))

    def forget(self, lg: PartitionLog) -> None:
        """``lg`` is no longer ours: cancel its scheduled deletions."""
        for key, (handle, owner) in list(self._pending.items()):
            if owner is lg:
                handle.cancel()
                del self._pending[key]

    # -- retirement -----------------------------------------------------------------------
    def retire(self, lg: PartitionLog, segs: Sequence[SegmentMeta]) -> None:
        """Schedule the objects of segments that ``lg``'s own commit removed from the
        manifest for deletion after the grace period (one timer for the batch)."""
        loop = asyncio.get_running_loop()
        grace = max(0, self.config.segment_delete_grace_ms) / 1000
        keys: list[str] = []
        for seg in segs:
            key = self.logs.object_key(lg, seg)
            self.logs.cache.evict(key)  # readers that already hold it keep their reference
            if is_range_key(key):  # a shared object's: the shared sweep (broker/shared_sweep.py)
                continue
            # a version 2 object has its index inside: no DELETE of an ``.index`` that
            # cannot exist (entries that do not record their version: both, as before)
            both = (key, index_key_for(key)) if seg.has_index_object else (key,)
            keys += [k for k in both if k not in self._pending]
        if not keys:
            return
        handle = loop.call_later(grace, self._spawn, keys)
        for k in keys:
            self._pending[k] = (handle, lg)

    async def flush(self) -> None:
        """Run every scheduled deletion now and wait for it (tests, tooling)."""
        pending, self._pending = self._pending, {}
        by_log: dict[int, tuple[PartitionLog, list[str]]] = {}
        for key, (handle, lg) in pending.items():
            handle.cancel()
            by_log.setdefault(id(lg), (lg, []))[1].append(key)
        for lg, keys in by_log.values():
            await self._delete_retired(lg, keys)
        if self._tasks:
            await asyncio.wait(list(self._tasks))

    def _spawn(self, keys: list[str]) -> None:
        owner: PartitionLog | None = None
        due: list[str] = []
        for key in keys:
            entry = self._pending.pop(key, None)
            if entry is not None:
                owner = entry[1]
                due.append(key)
        if owner is None:
            return
        task = asyncio.create_task(self._delete_retired(owner, due))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _delete_retired(self, lg: PartitionLog, keys: list[str]) -> None:
        if not self._current(lg):
            return  # no longer ours: the next owner's sweep collects them
        try:
            if not await self.logs.committer.owns(lg):
                log.warning("%s-%d: not deleting retired objects: fenced", lg.topic, lg.partition)
                self.logs.drop(lg, "fenced (found before a delete)")
                return
        except MetaStoreError as exc:
            log.warning("%s-%d: retired objects kept for now: %s", lg.topic, lg.partition, exc)
            return
        faults.checkpoint("retire.before_delete")
        await self._delete(keys)

    async def _delete(self, keys: list[str]) -> None:
        for key in keys:
            try:
                await self.logs.store.delete(key)
                self.logs.cache.evict(key)
                self.stats["deleted"] += 1
            except StoreError as exc:  # left for the next owner's sweep
                log.warning("could not delete %s: %s", key, exc)

    # -- sweeps ---------------------------------------------------------------------------
    async def sweep(self, lg: PartitionLog) -> int:
        """Delete the objects of ``lg`` that no manifest entry names and that no writer
        could still commit (see the module doc); returns how many."""
        if not self._current(lg):
            return 0
        prefix = partition_prefix(self.config.namespace, lg.topic, lg.partition)
        logs = self.logs
        faults.checkpoint("sweep.before_list")
        # committed in cycle keys, not folded yet: named, also if folded during the read
        unfolded = [s for s, _k in lg.unfolded]
        try:
            infos = await logs.store.list(prefix)  # listed before the manifest is read
            res = await logs.meta.txn(
                [logs.committer.owner_guard(lg)],
                [Get(segments_prefix(lg.topic, lg.partition), True)],
            )
        except (StoreError, MetaStoreError) as exc:
            log.warning("sweep of %s-%d skipped: %s", lg.topic, lg.partition, exc)
            return 0
        if not res.succeeded:
            logs.drop(lg, "fenced (found by a sweep)")
            return 0
        named: set[str] = set(self._pending)
        metas = [SegmentMeta.from_json(entry_base(kv.key), kv.value) for kv in res.gets[0]]
        for seg in (*metas, *unfolded, *(s for s, _k in lg.unfolded)):
            key = logs.object_key(lg, seg)
            named.update((key, index_key_for(key)))
        garbage = self._garbage(lg, infos, prefix, named)
        if garbage:
            log.info(
                "sweeping %d unreferenced objects of %s-%d", len(garbage), lg.topic, lg.partition
            )
            faults.checkpoint("sweep.before_delete")
            await self._delete(garbage)
            self.stats["swept"] += len(garbage)
        return len(garbage)

    def _garbage(
        self, lg: PartitionLog, infos: Sequence[ObjectInfo], prefix: str, named: set[str]
    ) -> list[str]:
        cutoff = time.time() - max(0, self.config.segment_delete_grace_ms) / 1000
        tag = topic_tag(lg.topic_id)
        out = []
        for info in infos:
            name = parse_object_name(info.key[len(prefix) :])
            if name is None or info.key in named:
                continue
            if info.modified <= 0 or info.modified > cutoff:
                continue  # younger than the grace period (or of unknown age)
            if name.epoch is not None and name.topic_tag == tag and name.epoch >= lg.epoch:
                continue  # ours (its outcome may be unknown) or a newer owner's
            out.append(info.key)
        return out


_DELETE_CONCURRENCY = 16


async def delete_topic_objects(
    store: ObjectStore, namespace: str, name: str, topic_id: uuid.UUID
) -> int:
    """Topic deletion: remove the objects of the deleted incarnation ``topic_id`` of
    ``name`` under ``{namespace}/{name}/``, sparing names that carry another topic id
    (``topic_garbage``): a topic re-created under the name keeps every object it writes
    meanwhile. Returns how many were deleted; a failure is logged, not raised (0)."""
    prefix = f"{namespace}/{name}/"
    try:
        faults.checkpoint("topic.before_list")
        keys = topic_garbage(await store.list(prefix), prefix, topic_id)
        for i in range(0, len(keys), _DELETE_CONCURRENCY):
            chunk = keys[i : i + _DELETE_CONCURRENCY]
            await asyncio.gather(*(store.delete(k) for k in chunk))
        log.info("deleted %s objects of topic %s", len(keys), name)
    except Exception as exc:
        log.warning("deleting objects of topic %s failed: %s", name, exc)
        return 0
    return len(keys)
