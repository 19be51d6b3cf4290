"""The shared sweep: deleting shared objects that no manifest entry names or can name again
(docs/format.md, "Shared objects"; ``segments/shared.py``).

A shared object holds the segments of many partitions, which may by now have different
owners, so no partition's retirement or sweep deletes it. The controller (the live broker
with the lowest id) looks at every shared object older than the deletion grace period,
every ``--shared-sweep-interval-ms``. It reads the object's directory and, per partition
named there, in one metadata transaction: the topic, the partition's end key and its
manifest entries. A segment of the object is **dead** when no entry names it and either
its topic is gone (or re-created: another topic id), or the partition's end has moved past
the segment's base offset, or its epoch is newer than the writer's.

Dead is final. The segment's commit, had it not happened yet, compares the end key's mod
revision with the one the writer read when the end was at that base offset; an end that
has moved on since (past the base, or to a new owner's epoch) was rewritten after that, so
the commit can never apply. A cycle key's entry (broker/fold.py) is read only while the
end is at or below its base under its epoch (broker/cycles.py): past that it is folded or
was never acknowledged. A segment whose commit is still in flight, or whose outcome is
unknown, or that only a cycle key names, leaves the end at or below its base under the
writer's epoch: not dead, so kept.

An object is deleted once every segment in it is dead and has been seen dead for a full
grace period (a reader may still hold an entry that a merge retired a moment ago). What
cannot be read (a missing directory, an unreachable store) is kept and looked at again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

from broker.config import BrokerConfig
from broker.meta import schema
from broker.meta.base import Get, KeyValue, MetaStore, MetaStoreError
from broker.tasks import cancel_and_wait
from segments.shared import (
    DIRECTORY_PROBE,
    SharedFormatError,
    SharedRange,
    directory_size,
    parse_directory,
    prefix,
)
from segments.store import ObjectNotFoundError, ObjectStore, StoreError

log = logging.getLogger(__name__)

# reads per partition in the sweep's transaction: topic, end, manifest entries
_READS = 3


def segment_dead(
    r: SharedRange, topic: KeyValue | None, end: KeyValue | None, entries: Sequence[KeyValue]
) -> bool:
    """Whether segment ``r`` of a shared object is unnamed and can never be named (see
    the module doc), from its partition's keys read at one revision."""
    for kv in entries:
        if schema.SegmentMeta.from_json(schema.entry_base(kv.key), kv.value).key == r.entry_name:
            return False  # named
    if topic is None:
        return True  # its topic was deleted
    if schema.TopicInfo.from_json(r.topic, topic.value).topic_id.hex != r.topic_id:
        return True  # deleted and created again: another incarnation
    if end is None:
        return False  # not taken yet, or its keys half deleted: look again later
    value = schema.EndValue.decode(end.value)
    return value.epoch > r.epoch or value.next_offset > r.base


class SharedSweeper:
    """Started and stopped by the ``LogManager``; tests drive ``run_once``."""

    def __init__(
        self,
        config: BrokerConfig,
        meta: MetaStore,
        store: Callable[[], ObjectStore],
        may_run: Callable[[], bool],
    ) -> None:
        self.config = config
        self.meta = meta
        self._store = store
        self._may_run = may_run
        self._dead_since: dict[str, float] = {}  # object key -> when first seen all dead
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self.stats = {"shared_passes": 0, "shared_deleted": 0}

    def start(self) -> None:
        if self._task is None and self.config.shared_sweep_interval_ms > 0:
            self._stopping.clear()
            self._task = asyncio.create_task(self._loop(), name="shared-sweep")

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    async def _loop(self) -> None:
        interval = self.config.shared_sweep_interval_ms / 1000
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._stopping.wait()
            # not the controller, or its lease in doubt: another broker sweeps
            if self._stopping.is_set() or not self._may_run():
                continue
            try:
                await self.run_once()
            except Exception:  # never let the sweep die
                log.exception("shared object sweep failed")

    @property
    def grace_s(self) -> float:
        return max(0, self.config.segment_delete_grace_ms) / 1000

    async def run_once(self, now: float | None = None) -> list[str]:
        """One pass; returns the keys of the shared objects it deleted."""
        now = time.time() if now is None else now
        store = self._store()
        try:
            infos = await store.list(prefix(self.config.namespace))
        except StoreError as exc:
            log.warning("shared object sweep skipped: %s", exc)
            return []
        self.stats["shared_passes"] += 1
        listed = {i.key for i in infos}
        for key in [k for k in self._dead_since if k not in listed]:
            del self._dead_since[key]
        deleted = []
        for info in infos:
            if not _shared_name(info.key[len(prefix(self.config.namespace)) :]):
                continue  # not a shared object (nothing else is written there)
            if info.modified <= 0 or info.modified > now - self.grace_s:
                continue  # younger than the grace period (or of unknown age)
            if not await self._all_dead(store, info.key):
                self._dead_since.pop(info.key, None)
                continue
            first = self._dead_since.setdefault(info.key, now)
            if now - first < self.grace_s:
                continue
            try:
                await store.delete(info.key)
            except StoreError as exc:
                log.warning("could not delete shared object %s: %s", info.key, exc)
                continue
            del self._dead_since[info.key]
            deleted.append(info.key)
        if deleted:
            log.info("deleted %d shared objects no entry names", len(deleted))
            self.stats["shared_deleted"] += len(deleted)
        return deleted

    async def _all_dead(self, store: ObjectStore, key: str) -> bool:
        try:
            ranges = await self._directory(store, key)
        except ObjectNotFoundError:
            return False  # deleted meanwhile: the next listing drops it
        except (StoreError, SharedFormatError) as exc:
            log.warning("shared object %s kept: %s", key, exc)
            return False
        by_partition: dict[tuple[str, int], list[SharedRange]] = defaultdict(list)
        for r in ranges:
            by_partition[(r.topic, r.partition)].append(r)
        parts = list(by_partition)
        per_txn = max(1, self.meta.max_txn_ops // _READS)
        for i in range(0, len(parts), per_txn):
            chunk = parts[i : i + per_txn]
            ops = [
                op
                for t, p in chunk
                for op in (
                    Get(schema.topic_key(t)),
                    Get(schema.end_key(t, p)),
                    Get(schema.segments_prefix(t, p), True),
                )
            ]
            try:
                res = await self.meta.txn([], ops)
            except MetaStoreError as exc:
                log.warning("shared object %s kept for now: %s", key, exc)
                return False
            for j, tp in enumerate(chunk):
                topic, end, entries = res.gets[_READS * j : _READS * j + _READS]
                for r in by_partition[tp]:
                    try:
                        dead = segment_dead(r, _one(topic), _one(end), entries)
                    except (ValueError, KeyError, TypeError) as exc:  # a value it cannot read
                        log.warning("shared object %s kept: %s-%d: %s", key, *tp, exc)
                        return False
                    if not dead:
                        return False
        return True

    @staticmethod
    async def _directory(store: ObjectStore, key: str) -> list[SharedRange]:
        head = await store.get(key, 0, DIRECTORY_PROBE)
        size = directory_size(head)
        if size > len(head):
            head = await store.get(key, 0, size)
        return parse_directory(key.rsplit("/", 1)[-1], head)


def _shared_name(name: str) -> bool:
    return name.endswith(".kfm") and "/" not in name


def _one(kvs: Sequence[KeyValue]) -> KeyValue | None:
    return kvs[0] if kvs else None
