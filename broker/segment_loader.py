"""Whole-segment loads for the read path (broker/reads.py; docs/architecture.md, the read
path): cold reads at the object store's bandwidth.

- **One load per object at a time**: fetch reads that miss the cache on the same segment
  share one GET (and one cache insertion), a readahead's included, instead of each
  fetching it. Merges and timestamp lookups load on their own (``shared=False``).
- **Parallel ranged GETs**: on a store that declares ``parallel_ranged_gets`` (S3 with
  ``parallel_gets=true`` in its URL, for stores whose single stream is slow), a segment
  larger than ``PART`` is fetched as ranged GETs of ``PART`` bytes at once, each with
  ``If-Match`` on the manifest's ETag, and joined; a length that does not match the
  manifest falls back to one whole GET.
- **Readahead**: after a reader missed the cache, the next ``READAHEAD`` segments of the
  partition (those the manifest says are small enough to read whole) are loaded into the
  cache in the background, so a consumer reading from the start of a partition finds
  them there. A failed readahead is dropped silently: the reader that needs the segment
  loads it again and handles the error as the read path does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from broker.meta.schema import SegmentMeta
from segments.cache import SegmentCache
from segments.store import ObjectStore

log = logging.getLogger(__name__)

PART = 4 * 1024 * 1024  # bytes per ranged GET of a parallel load
READAHEAD = 2  # segments loaded ahead of a reader that missed the cache
MAX_BACKGROUND = 8  # readahead loads in flight per broker


class SegmentLoader:
    def __init__(self, store: Callable[[], ObjectStore], cache: Callable[[], SegmentCache]):
        self._store = store
        self._cache = cache
        self._loading: dict[str, asyncio.Future[bytes]] = {}
        self._background = 0

    async def load(self, key: str, seg: SegmentMeta, shared: bool = True) -> bytes:
        """The whole object ``key`` of ``seg`` (not cached yet), inserted into the cache.
        ``shared``: join a load of ``key`` already in flight, or start one others may join;
        otherwise fetch on its own (a caller that must not wait behind another's GET)."""
        if not shared:
            return await self._fetch(key, seg)
        fut = self._loading.get(key)
        if fut is None:
            fut = self._start(key, seg)
        return await asyncio.shield(fut)

    def readahead(self, keyed: Sequence[tuple[str, SegmentMeta]], whole_limit: int) -> None:
        """Load the first ``READAHEAD`` of ``keyed`` (the segments after the one a reader
        just fetched) that are neither cached nor loading, in the background."""
        cache = self._cache()
        for key, seg in keyed[:READAHEAD]:
            if seg.size > whole_limit or self._background >= MAX_BACKGROUND:
                return
            if key in self._loading or cache.get(key, seg.etag) is not None:
                continue
            self._background += 1
            fut = self._start(key, seg)
            fut.add_done_callback(self._background_done)

    def _background_done(self, fut: asyncio.Future[bytes]) -> None:
        self._background -= 1
        if not fut.cancelled() and fut.exception() is not None:  # retrieved: no warning
            log.debug("readahead failed: %s", fut.exception())

    def _start(self, key: str, seg: SegmentMeta) -> asyncio.Future[bytes]:
        fut = asyncio.ensure_future(self._fetch(key, seg))
        self._loading[key] = fut
        fut.add_done_callback(lambda f: self._done(key, f))
        return fut

    def _done(self, key: str, fut: asyncio.Future[bytes]) -> None:
        self._loading.pop(key, None)
        if not fut.cancelled():
            fut.exception()  # retrieved: the readers that await it get it themselves

    async def _fetch(self, key: str, seg: SegmentMeta) -> bytes:
        store = self._store()
        etag = seg.etag or None
        data: bytes | None = None
        if getattr(store, "parallel_ranged_gets", False) and seg.size > PART:
            parts = await asyncio.gather(
                *(store.get(key, lo, min(lo + PART, seg.size), etag)
                  for lo in range(0, seg.size, PART))
            )  # fmt: skip
            if sum(len(p) for p in parts) == seg.size:  # joined off the loop (GIL dropped)
                data = await asyncio.to_thread(b"".join, parts)
        if data is None:
            data = await store.get(key, if_match=etag)
        self._cache().put(key, data, None, seg.etag)
        return data
