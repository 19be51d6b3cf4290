"""Windows of segments too large to read whole (broker/reads.py; docs/architecture.md,
the read path).

A segment above the whole-read limit is read as **windows**: ranges of whole batches of
about ``WINDOW`` bytes, each fetched with one ranged GET (``If-Match`` the manifest's
ETag) and cached like a small segment under ``{key}#{start}``. Window boundaries are
batch starts taken from the segment's sparse index (the first indexed batch at or after
each multiple of ``WINDOW``), so every reader of a segment cuts it the same way and a
window holds whole batches only. Readers of the same window share its load, and the
windows after the one a reader is served from are read ahead on every read
(``broker/segment_loader``),
so a consumer of a large segment streams it at the store's bandwidth instead of paying
a GET of the index and a ranged GET for every fetch.

The layout (index and boundaries) of recently read segments is kept (``LAYOUTS``), keyed
by object key and ETag.
"""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from broker.meta.schema import SegmentMeta
from broker.segment_loader import Piece, SegmentLoader
from protocol.batch import BATCH_HEADER_SIZE, BatchHeader, read_header
from segments.cache import SegmentCache
from segments.format import FOOTER_SIZE, HEADER_SIZE, CorruptSegmentError, IndexEntry, lookup

log = logging.getLogger(__name__)

WINDOW = 8 * 1024 * 1024  # bytes per window (about: boundaries are indexed batch starts)
LAYOUTS = 256  # layouts of large segments kept
_EMPTY = memoryview(b"")


@dataclass(frozen=True, slots=True)
class Layout:
    etag: str
    index: Sequence[IndexEntry]
    bounds: list[int]  # window starts (batch positions), ascending; bounds[0] = HEADER_SIZE
    end: int  # where the body ends (the footer's position)

    def window_at(self, pos: int) -> tuple[int, int]:
        """The window ``[start, end)`` holding byte ``pos`` of the body."""
        i = max(0, bisect_right(self.bounds, pos) - 1)
        return self.bounds[i], self.bounds[i + 1] if i + 1 < len(self.bounds) else self.end

    def windows_from(self, pos: int) -> Iterator[tuple[int, int]]:
        """The windows from the one holding ``pos`` to the end of the body."""
        if pos >= self.end:
            return
        i = max(0, bisect_right(self.bounds, pos) - 1)
        for j in range(i, len(self.bounds)):
            yield self.bounds[j], self.bounds[j + 1] if j + 1 < len(self.bounds) else self.end


def make_layout(
    index: Sequence[IndexEntry], size: int, etag: str, window: int = WINDOW, trailer: int = 0
) -> Layout:
    """Cut a segment of ``size`` bytes into windows at indexed batch starts; ``trailer``
    is the length of its index trailer (format version 2), which no window covers."""
    end = size - FOOTER_SIZE - trailer
    bounds = [HEADER_SIZE]
    for e in index:
        if bounds[-1] + window <= e.position < end:
            bounds.append(e.position)
    return Layout(etag, index, bounds, end)


def window_key(key: str, start: int) -> str:
    return f"{key}#{start}"


def slice_window(data: bytes, start: int, pos: int, offset: int, max_bytes: int) -> memoryview:
    """Whole batches from the window ``data`` (the body's bytes from ``start``): the batch
    holding ``offset`` (walking from byte ``pos`` of the body), then the following ones
    that fit ``max_bytes``. Empty when the window ends before that batch."""
    view = memoryview(data)
    rel, total = _slice(view, start, pos, offset, max_bytes)
    return view[rel : rel + total] if total else _EMPTY


def _slice(view: memoryview, start: int, pos: int, offset: int, max_bytes: int) -> tuple[int, int]:
    """``slice_window``'s batches as (position in ``view``, length); length 0: none."""
    rel, n = pos - start, len(view)
    while rel < n:
        hdr = _header(view, rel, start)
        if hdr.last_offset >= offset:
            total = hdr.size
            while rel + total + BATCH_HEADER_SIZE <= n:
                size = _header(view, rel + total, start).size
                if total + size > max_bytes:
                    break
                total += size
            return rel, total
        rel += hdr.size
    return rel, 0


def _header(view: memoryview, rel: int, start: int) -> BatchHeader:
    if len(view) - rel < BATCH_HEADER_SIZE:
        raise CorruptSegmentError(f"truncated batch header at byte {start + rel}")
    hdr = read_header(view, rel)
    if hdr.magic != 2 or hdr.size < BATCH_HEADER_SIZE or rel + hdr.size > len(view):
        raise CorruptSegmentError(f"bad record batch framing at byte {start + rel}")
    return hdr


class Windows:
    def __init__(self, loader: SegmentLoader, cache: Callable[[], SegmentCache]) -> None:
        self.loader = loader
        self._cache = cache
        self._layouts: OrderedDict[str, Layout] = OrderedDict()
        self._preparing: dict[str, asyncio.Future[tuple[Sequence[IndexEntry], int]]] = {}
        self.window = WINDOW

    def layout(self, key: str, seg: SegmentMeta) -> Layout | None:
        """The remembered layout of ``key`` (None: read its index, then ``remember``)."""
        layout = self._layouts.get(key)
        if layout is None or layout.etag != seg.etag:
            return None
        self._layouts.move_to_end(key)
        return layout

    def remember(
        self, key: str, seg: SegmentMeta, index: Sequence[IndexEntry], trailer: int = 0
    ) -> Layout:
        layout = self._layouts[key] = make_layout(index, seg.size, seg.etag, self.window, trailer)
        if len(self._layouts) > LAYOUTS:
            self._layouts.popitem(last=False)
        return layout

    def prepare(
        self,
        key: str,
        seg: SegmentMeta,
        index: Callable[[], Awaitable[tuple[Sequence[IndexEntry], int]]],
    ) -> None:
        """Read ``key``'s index in the background (once at a time) and remember its
        layout, so readahead can continue into its windows; a failure is dropped (the
        reader that needs the layout reads the index itself)."""
        if key in self._preparing or self.layout(key, seg) is not None:
            return
        task = asyncio.ensure_future(index())
        self._preparing[key] = task

        def done(t: asyncio.Future[tuple[Sequence[IndexEntry], int]]) -> None:
            self._preparing.pop(key, None)
            if t.cancelled():
                return
            if t.exception() is not None:
                log.debug("layout of %s not read ahead: %s", key, t.exception())
                return
            self.remember(key, seg, *t.result())

        task.add_done_callback(done)

    def pieces(self, key: str, seg: SegmentMeta, pos: int) -> Iterator[Piece]:
        """The windows of ``key`` from the one holding ``pos`` on, as loader pieces."""
        layout = self._layouts.get(key)
        if layout is not None:
            for lo, hi in layout.windows_from(pos):
                yield Piece(window_key(key, lo), key, seg, lo, hi)

    def cached(self, key: str, seg: SegmentMeta, offset: int) -> bool:
        """Whether the window a read of ``offset`` starts from is in the cache (its
        layout known): such a read waits for no GET."""
        layout = self.layout(key, seg)
        if layout is None:
            return False
        lo, _hi = layout.window_at(_start(layout, offset))
        return self._cache().get(window_key(key, lo), seg.etag) is not None

    async def read_to(
        self,
        key: str,
        seg: SegmentMeta,
        layout: Layout,
        offset: int,
        max_bytes: int,
        following: Callable[[], Iterable[Piece]],
    ) -> tuple[memoryview, bool]:
        """Whole batches from ``offset`` out of the window holding it (an empty view when
        ``offset`` is past the segment's last batch), and whether they end at their
        window's end (not at ``max_bytes``): the reader may go on into the next window
        with what is left of its budget (broker/reads.py), instead of answering a short
        fetch at every window boundary (docs/benchmarks.md, Round 4: cold reads).
        ``following``: the pieces after this segment, read ahead once the reader is in its
        last windows."""
        pos = _start(layout, offset)
        while pos < layout.end:
            lo, hi = layout.window_at(pos)
            wkey = window_key(key, lo)
            cached = self._cache().get(wkey, seg.etag)
            if cached is not None:
                data = cached.data
            else:
                data = await self.loader.load_piece(Piece(wkey, key, seg, lo, hi))
            if len(data) != hi - lo:
                raise CorruptSegmentError(f"{key}: window at {lo} is {len(data)} bytes")
            # every read tops up the readahead (broker/segment_loader.py): the loads
            # follow the reader (a miss's after its own load, which they would slow down)
            self.loader.readahead(_chain(self.pieces(key, seg, hi), following))
            view = memoryview(data)
            rel, total = _slice(view, lo, pos, offset, max_bytes)
            if total:
                return view[rel : rel + total], rel + total == len(view)
            pos = hi
        return _EMPTY, False


def _start(layout: Layout, offset: int) -> int:
    """The indexed batch position a read of ``offset`` starts walking from."""
    entry = lookup(layout.index, offset)
    return entry.position if entry is not None else HEADER_SIZE


def _chain(first: Iterable[Piece], then: Callable[[], Iterable[Piece]]) -> Iterator[Piece]:
    yield from first
    yield from then()
