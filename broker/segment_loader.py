"""Segment loads for the read path (broker/reads.py; docs/architecture.md, the read path):
cold reads at the object store's bandwidth.

A **piece** is what one load brings into the segment cache: a whole segment object, or
one window (a ranged GET of whole batches, ``broker/segment_windows.py``) of a segment
too large to read whole.

- **One load per piece at a time**: fetch reads that miss the cache on the same piece
  share one GET (and one cache insertion), a readahead's included, instead of each
  fetching it. Merges and timestamp lookups load on their own (``shared=False``).
- **Parallel ranged GETs**: on a store that declares ``parallel_ranged_gets`` (S3 with
  ``parallel_gets=true`` in its URL, for stores whose single stream is slow), a piece
  larger than ``PART`` is fetched as ranged GETs of ``PART`` bytes at once, each with
  ``If-Match`` on the manifest's ETag, and joined; a length that does not match falls
  back to one GET.
- **Readahead**: every read tops up the pieces after the one it is served from (the
  rest of the segment's windows, then the following segments) in the background until
  ``readahead_bytes`` lie ahead of the reader (at least one piece; the pieces already
  cached or loading count), so a consumer reading a partition from the start finds the
  next pieces in the cache, and its GETs overlap with serving it: the loads follow the
  reader as it moves, and continue into a large segment's windows as soon as its layout
  is known (docs/benchmarks.md, Round 3: cold reads). A reader that misses starts the
  readahead after its own load, which concurrent GETs would slow. A failed readahead is
  dropped silently: the reader that needs the piece loads it again and handles the
  error as the read path does.
- **An index per loaded segment**: a whole segment is cached with a sparse index built
  from its batch headers (``sparse_index``), so a fetch from it does not walk its batches
  from the start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from broker.meta.schema import SegmentMeta
from segments.cache import SegmentCache
from segments.format import CorruptSegmentError, IndexEntry, iter_batch_frames
from segments.joins import join
from segments.offload import to_thread
from segments.store import Buffer, ObjectStore

log = logging.getLogger(__name__)

PART = 4 * 1024 * 1024  # bytes per ranged GET of a parallel load
READAHEAD_BYTES = 24 * 1024 * 1024  # bytes kept loading ahead of a reader (at most)
READAHEAD_CACHE_SHARE = 3  # ... and at most this share of the cache (1/3)
MAX_BACKGROUND = 8  # readahead loads in flight per broker
INDEX_EVERY = 64 * 1024  # bytes of batches per entry of a loaded segment's index


@dataclass(frozen=True, slots=True)
class Piece:
    """``key``'s bytes ``[lo, hi)`` (``hi`` < 0: the whole object), cached as ``cache_key``."""

    cache_key: str
    key: str
    seg: SegmentMeta
    lo: int = 0
    hi: int = -1

    @property
    def size(self) -> int:
        return self.seg.size if self.hi < 0 else self.hi - self.lo

    @classmethod
    def whole(cls, key: str, seg: SegmentMeta) -> Piece:
        return cls(key, key, seg)


def ranges(lo: int, hi: int, part: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` as consecutive ranges of ``part`` bytes (the last may be shorter)."""
    return [(a, min(a + part, hi)) for a in range(lo, hi, part)]


class SegmentLoader:
    def __init__(
        self,
        store: Callable[[], ObjectStore],
        cache: Callable[[], SegmentCache],
        readahead_bytes: int = READAHEAD_BYTES,
    ):
        self._store = store
        self._cache = cache
        self.readahead_bytes = readahead_bytes
        self._loading: dict[str, asyncio.Future[Buffer]] = {}
        self._background = 0

    async def load(self, key: str, seg: SegmentMeta, shared: bool = True) -> Buffer:
        """The whole object ``key`` of ``seg`` (not cached yet), inserted into the cache.
        ``shared``: join a load of ``key`` already in flight, or start one others may join;
        otherwise fetch on its own (a caller that must not wait behind another's GET)."""
        return await self.load_piece(Piece.whole(key, seg), shared)

    async def load_piece(self, piece: Piece, shared: bool = True) -> Buffer:
        """``piece`` (not cached yet), inserted into the cache (see ``load``)."""
        if not shared:
            return await self._fetch(piece)
        fut = self._loading.get(piece.cache_key)
        if fut is None:
            fut = self._start(piece)
        return await asyncio.shield(fut)

    def budget(self) -> int:
        """Bytes to keep ahead of a reader: ``readahead_bytes``, at most a share of the cache."""
        return min(self.readahead_bytes, self._cache().max_bytes // READAHEAD_CACHE_SHARE)

    def readahead(self, pieces: Iterable[Piece]) -> int:
        """Load the ``pieces`` (in reading order, after the one a reader is served from)
        that are neither cached nor loading, in the background, until ``budget()`` bytes
        lie ahead (at least one piece; none with a budget of 0). Returns the number of
        loads started."""
        cache, budget = self._cache(), self.budget()
        if budget <= 0:
            return 0
        ahead = started = 0
        for piece in pieces:
            if ahead and ahead + piece.size > budget:
                break
            if self._background >= MAX_BACKGROUND:
                break
            ahead += piece.size
            if piece.cache_key in self._loading or piece.cache_key in cache:
                continue
            self._background += 1
            started += 1
            fut = self._start(piece)
            fut.add_done_callback(self._background_done)
        return started

    def _background_done(self, fut: asyncio.Future[Buffer]) -> None:
        self._background -= 1
        if not fut.cancelled() and fut.exception() is not None:  # retrieved: no warning
            log.debug("readahead failed: %s", fut.exception())

    def _start(self, piece: Piece) -> asyncio.Future[Buffer]:
        fut = asyncio.ensure_future(self._fetch(piece))
        self._loading[piece.cache_key] = fut
        fut.add_done_callback(lambda f: self._done(piece.cache_key, f))
        return fut

    def _done(self, key: str, fut: asyncio.Future[Buffer]) -> None:
        self._loading.pop(key, None)
        if not fut.cancelled():
            fut.exception()  # retrieved: the readers that await it get it themselves

    async def _fetch(self, piece: Piece) -> Buffer:
        store = self._store()
        # S3: a read-only buffer read straight off the socket (segments/s3_direct.py)
        get = getattr(store, "get_buffer", store.get)
        etag = piece.seg.etag or None
        whole = piece.hi < 0
        lo, hi = (0, piece.seg.size) if whole else (piece.lo, piece.hi)
        data: Buffer | None = None
        if getattr(store, "parallel_ranged_gets", False) and hi - lo > PART:
            get_parts = getattr(store, "get_parts", None)  # S3: into one buffer, no join
            if get_parts is not None:
                data = await get_parts(piece.key, lo, hi, PART, etag)
            if data is None:
                parts = await asyncio.gather(
                    *(get(piece.key, a, b, etag) for a, b in ranges(lo, hi, PART))
                )
                if sum(len(p) for p in parts) == hi - lo:  # joined off the loop, no GIL
                    data = await to_thread(join, parts)
        if data is None:
            data = await (
                get(piece.key, None, None, etag) if whole else get(piece.key, lo, hi, etag)
            )
        index = sparse_index(data) if whole else None  # windows: their layout's index
        self._cache().put(piece.cache_key, data, index, piece.seg.etag)
        return data


def sparse_index(data: Buffer, every: int = INDEX_EVERY) -> list[IndexEntry] | None:
    """An index of a whole segment read from the store (one entry per ``every`` bytes of
    batches), kept with it in the cache so that fetches from it start near their offset
    instead of walking its batch headers from the start. None when its framing is bad
    (the reader reports that as before)."""
    out: list[IndexEntry] = []
    last = -every
    try:
        for pos, first, _view in iter_batch_frames(data):
            if pos - last >= every:
                out.append(IndexEntry(first, pos))
                last = pos
    except CorruptSegmentError:
        return None
    return out
