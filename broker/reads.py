"""The read path: committed batches of an owned partition, from the cache or the store.

The manifest an owner reads from is its ``PartitionLog.segments``, which it loaded when it
took the partition and has kept current with its own commits since. A segment object
found missing (merged away and deleted after the grace period, or lost) is resolved
against the in-memory manifest once more, then against the manifest read fresh from the
metadata store under the owner's guard. If the object is still referenced, the read fails
with ``StoreError`` (the Fetch handler answers a retriable error for that partition
alone); if this broker is no longer the owner, with NOT_LEADER_OR_FOLLOWER. A read never
answers "no data" below the high watermark because an object was missing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING

from broker.meta.base import Get, MetaStoreError
from broker.meta.schema import entry_base, segments_prefix
from broker.partition import PartitionLog, SegmentMeta
from broker.segment_loader import Piece, SegmentLoader
from broker.segment_windows import Windows
from protocol.batch import iter_batches
from protocol.errors import ErrorCode, KafkaProtocolError
from segments.cache import CachedSegment
from segments.format import IndexEntry, partition_prefix, segment_key
from segments.reader import load_index, slice_batches
from segments.store import Buffer, ObjectNotFoundError, PreconditionFailedError, StoreError

if TYPE_CHECKING:
    from broker.logs import LogManager

log = logging.getLogger(__name__)

WHOLE_READ_LIMIT = 16 * 1024 * 1024  # segments up to this size are read (and cached) whole


class Reader:
    def __init__(self, logs: LogManager) -> None:
        self.logs = logs
        self.namespace = logs.config.namespace
        self.last_read = -1
        # shared loads, parallel ranged GETs and readahead (broker/segment_loader.py)
        self.loader = SegmentLoader(
            lambda: self.logs.store, lambda: self.logs.cache, logs.config.readahead_bytes
        )
        self.windows = Windows(self.loader, lambda: self.logs.cache)  # of large segments

    def object_key(self, lg: PartitionLog, seg: SegmentMeta) -> str:
        """The object key of a committed segment (entries name theirs; legacy entries
        without a name are at the plain key)."""
        if seg.key:
            return partition_prefix(self.namespace, lg.topic, lg.partition) + seg.key
        return segment_key(self.namespace, lg.topic, lg.partition, seg.base)

    async def segment_data(
        self, lg: PartitionLog, seg: SegmentMeta, shared: bool = False
    ) -> Buffer:
        """The whole segment (cached). ``shared``: a fetch's read may join a load of the
        same object already in flight (a readahead); other callers (merges, timestamp
        lookups) load on their own, never waiting behind a reader's GET."""
        key = self.object_key(lg, seg)
        cache = self.logs.cache
        cached = cache.get(key, seg.etag)
        if cached is not None:
            return cached.data
        return await self.loader.load(key, seg, shared)

    def cached_data(self, lg: PartitionLog, seg: SegmentMeta) -> Buffer | None:
        """The whole segment if the cache holds it (this version of it), else None;
        nothing is loaded (merges: a task per cached segment only costs time)."""
        cached = self.logs.cache.get(self.object_key(lg, seg), seg.etag)
        return None if cached is None else cached.data

    async def segment_batches(self, lg: PartitionLog, seg: SegmentMeta) -> Buffer:
        """The whole segment object (cached), for timestamp lookups and merges; a missing
        object is checked against the fresh manifest first (see the module doc)."""
        try:
            return await self.segment_data(lg, seg)
        except (ObjectNotFoundError, PreconditionFailedError):
            await self.check_manifest(lg)
            raise

    async def read(self, lg: PartitionLog, offset: int, max_bytes: int) -> list[memoryview]:
        """Whole batches from ``offset`` (at least one when any is committed), up to
        ``max_bytes``; continues into following segments while they are cached.

        The segment holding each offset is looked up afresh in ``lg.segments`` (a merge or
        a head truncation may swap the list while a read waits); a missing object is
        resolved as the module doc says."""
        out: list[memoryview] = []
        total = 0
        remote_reads = 0
        attempts = 0
        self.last_read = -1  # the last offset in ``out`` (read by the metrics, logs.py)
        while offset < lg.hw and total < max_bytes:
            idx = lg.segment_index(offset)
            if idx < 0:
                break
            seg = lg.segments[idx]
            if seg.last < offset:  # a gap in the manifest: skip to the next segment
                if idx + 1 >= len(lg.segments):
                    break
                offset = lg.segments[idx + 1].base
                continue
            key = self.object_key(lg, seg)
            cached = self.logs.cache.get(key, seg.etag)
            # a read waits for one load at most: it stops before a second piece that is
            # not cached (a large segment's cached window counts as cached)
            ready = cached is not None or (
                seg.size > WHOLE_READ_LIMIT and self.windows.cached(key, seg, offset)
            )
            if not ready and remote_reads:
                break
            following = self._following(lg, idx)
            try:
                view, window_end = await self._read_one(
                    seg, key, cached, offset, max_bytes - total, following
                )
            except (ObjectNotFoundError, PreconditionFailedError):
                attempts += 1
                now = lg.segment_index(offset)
                if now >= 0 and lg.segments[now] is not seg and attempts <= 2:
                    continue  # the manifest moved on while we read: read the new entry
                if attempts > 2 or not await self.check_manifest(lg):
                    raise
                continue
            if seg.size <= WHOLE_READ_LIMIT:  # every read: loads follow the reader
                self.loader.readahead(following())  # (large segments: by their windows)
            if len(view) == 0:  # past the last batch (a compacted segment's gap): read on
                offset = seg.last + 1
                continue
            remote_reads += not ready
            if out and total + len(view) > max_bytes:
                break
            out.append(view)
            total += len(view)
            last = self.last_read = _last_offset(view)
            # the budget ended inside this segment (not a window of it: read on into the
            # next window with the rest of the budget)
            if last < seg.last and not seg.cleaned and not window_end:
                break
            offset = last + 1  # (a compacted segment may end in a gap: read on to see)
        return out

    def _following(self, lg: PartitionLog, idx: int) -> Callable[[], Iterator[Piece]]:
        """The pieces after segment ``idx`` in reading order, for readahead (lazily: the
        loader stops at its byte budget): whole segments, then the windows of a large
        one whose layout is known (an unknown one ends them)."""

        def pieces() -> Iterator[Piece]:
            segs = lg.segments  # (no copy of its tail: this runs on every read)
            for i in range(idx + 1, len(segs)):
                seg = segs[i]
                key = self.object_key(lg, seg)
                if seg.size <= WHOLE_READ_LIMIT:
                    yield Piece.whole(key, seg)
                elif self.windows.layout(key, seg) is None:  # its index, in the background
                    self.windows.prepare(key, seg, partial(self._index, key, seg))
                    return
                else:
                    yield from self.windows.pieces(key, seg, 0)

        return pieces

    async def _read_one(
        self,
        seg: SegmentMeta,
        key: str,
        cached: CachedSegment | None,
        offset: int,
        budget: int,
        following: Callable[[], Iterator[Piece]],
    ) -> tuple[memoryview, bool]:
        """Whole batches from ``offset`` in ``seg``, and whether they end at the end of a
        window of it with budget left (whole segments: never)."""
        if cached is not None:
            return slice_batches(cached.data, cached.index, offset, budget), False
        if seg.size <= WHOLE_READ_LIMIT:
            data = await self.loader.load(key, seg, shared=True)
            return slice_batches(data, None, offset, budget), False
        # larger segments: by windows (broker/segment_windows.py)
        layout = self.windows.layout(key, seg)
        if layout is None:
            layout = self.windows.remember(key, seg, *await self._index(key, seg))
        return await self.windows.read_to(key, seg, layout, offset, budget, following)

    async def _index(self, key: str, seg: SegmentMeta) -> tuple[list[IndexEntry], int]:
        """The sparse index of the segment object ``key`` and its trailer's length (a
        version 2 segment carries it; a version 1 segment's is the ``.index`` object)."""
        return await load_index(self.logs.store, key, seg.size, seg.etag)

    async def check_manifest(self, lg: PartitionLog) -> bool:
        """Compare ``lg``'s manifest with the store's, read under the owner's guard.

        Returns True when they differed (``lg`` now has the store's: read again), False
        when they agree (the object is really missing). Raises NOT_LEADER_OR_FOLLOWER
        (after dropping ``lg``) when this broker no longer owns the partition, and
        StoreError when the metadata store cannot answer."""
        logs = self.logs
        # under the commit lock: no commit of this broker is in flight, so the store's
        # manifest and ``lg``'s can only differ if something is wrong (guarded on the
        # owner value alone: the end revision moves with every commit)
        async with logs.committer.lock:
            if lg.unfolded:  # the store's manifest first holds what cycle keys name
                await logs.folder.fold([lg])
                if lg.unfolded:
                    raise KafkaProtocolError(ErrorCode.NOT_LEADER_OR_FOLLOWER)
            try:
                res = await logs.meta.txn(
                    [logs.committer.owner_guard(lg)],
                    [Get(segments_prefix(lg.topic, lg.partition), True)],
                )
            except MetaStoreError as exc:
                raise StoreError(
                    f"manifest of {lg.topic}-{lg.partition} unavailable: {exc}"
                ) from exc
            if not res.succeeded:
                logs.drop(lg, "fenced (found while reading)")
                raise KafkaProtocolError(ErrorCode.NOT_LEADER_OR_FOLLOWER)
            fresh = [SegmentMeta.from_json(entry_base(kv.key), kv.value) for kv in res.gets[0]]
            if fresh == lg.segments:
                log.error(
                    "%s-%d: a committed segment object is missing from the store",
                    lg.topic,
                    lg.partition,
                )
                return False
            log.warning("%s-%d: manifest reloaded from the metadata store", lg.topic, lg.partition)
            lg.set_segments(fresh)
            return True


def _last_offset(view: memoryview) -> int:
    last = -1
    for hdr, _ in iter_batches(view):
        last = hdr.last_offset
    return last
