"""The topic table: an in-memory copy of ``/topics/`` kept current through a watch.

``TopicTable`` loads a consistent snapshot of the prefix, then follows it with a watch; on
any failure it backs off, reloads a snapshot and watches again from that snapshot's
revision, so a metadata-store outage (or compaction) never leaves a stale view. Changes
are applied in revision order per name (tombstones too) and reported to listeners;
lookups are sync. ``TopicManager`` (``broker.topics``) builds the writes on top of it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

from broker.meta.base import Get, KeyValue, MetaStore
from broker.meta.schema import TOPICS_PREFIX, TopicInfo

log = logging.getLogger(__name__)

_RETRY_S = 0.5

Listener = Callable[[str, TopicInfo | None], None]


def _reraise_if_cancelled(exc: BaseException) -> None:
    """Re-raise a CancelledError meant for this task. A client library (grpc) may raise
    CancelledError when its channel is closed underneath a call; that is a failure to
    recover from, not a request to stop."""
    if isinstance(exc, asyncio.CancelledError):
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise exc


class TopicTable:
    """The cluster's topics by name and by id, cached from the metadata store."""

    def __init__(self, meta: MetaStore) -> None:
        self._meta = meta
        self._topics: dict[str, TopicInfo] = {}
        self._by_id: dict[uuid.UUID, TopicInfo] = {}
        self._revs: dict[str, int] = {}  # last revision applied per name (tombstones too)
        self._listeners: list[Listener] = []
        self._watch_task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ lookups

    def get(self, name: str) -> TopicInfo | None:
        return self._topics.get(name)

    def get_by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        return self._by_id.get(topic_id)

    def all(self) -> list[TopicInfo]:
        return sorted(self._topics.values(), key=lambda t: t.name)

    def add_listener(self, cb: Listener) -> None:
        """``cb(name, info)`` on every change applied to the cache; ``info`` None = deleted."""
        self._listeners.append(cb)

    def remove_listener(self, cb: Listener) -> None:
        if cb in self._listeners:
            self._listeners.remove(cb)

    # ------------------------------------------------------------ cache

    def _apply(self, name: str, info: TopicInfo | None, revision: int) -> None:
        if revision <= self._revs.get(name, 0):
            return
        self._revs[name] = revision
        old = self._topics.pop(name, None)
        if old is not None:
            self._by_id.pop(old.topic_id, None)
        if info is not None:
            self._topics[name] = info
            self._by_id[info.topic_id] = info
        elif old is None:
            return
        if old == info:
            return
        for cb in list(self._listeners):
            try:
                cb(name, info)
            except Exception:
                log.exception("topic listener failed for %s", name)

    def _apply_kv(self, kv: KeyValue) -> TopicInfo | None:
        name = kv.key[len(TOPICS_PREFIX) :]
        try:
            info = TopicInfo.from_json(name, kv.value)
        except (ValueError, KeyError, TypeError):
            log.warning(
                "ignoring malformed topic record %s at revision %s", kv.key, kv.mod_revision
            )
            return None
        self._apply(name, info, kv.mod_revision)
        return info

    async def _sync(self) -> int:
        """Load a consistent snapshot of ``/topics/``; returns its store revision."""
        result = await self._meta.txn([], [Get(TOPICS_PREFIX, prefix=True)])
        kvs = result.gets[0] if result.gets else ()
        seen = {kv.key[len(TOPICS_PREFIX) :] for kv in kvs}
        for name in [n for n in self._topics if n not in seen]:
            self._apply(name, None, result.revision)
        for kv in kvs:
            self._apply_kv(kv)
        return result.revision

    async def _follow(self, revision: int) -> int:
        """Apply watch events after ``revision`` until the watch ends; returns the last."""
        async for ev in self._meta.watch(TOPICS_PREFIX, start_revision=revision + 1):
            revision = max(revision, ev.mod_revision)
            name = ev.key[len(TOPICS_PREFIX) :]
            if ev.type == "delete":
                self._apply(name, None, ev.mod_revision)
            else:
                self._apply_kv(KeyValue(ev.key, ev.value, 0, ev.mod_revision, 1))
        return revision

    async def _watch(self, revision: int) -> None:
        """Follow ``/topics/``; on any failure back off, reload a snapshot, watch again."""
        while True:
            try:
                revision = await self._follow(revision)
                log.warning("topics watch ended; resyncing")
            except (Exception, asyncio.CancelledError) as exc:
                _reraise_if_cancelled(exc)
                log.warning("topics watch failed (%s); resyncing", exc)
                await asyncio.sleep(_RETRY_S)  # back off before reconnecting, not a poll
            try:
                revision = await self._sync()
            except (Exception, asyncio.CancelledError) as exc:
                _reraise_if_cancelled(exc)
                log.warning("topics resync failed: %s", exc)
