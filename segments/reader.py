"""Reading whole record batches out of segment objects (ranged GETs, sparse index).

``read_from`` serves a fetch from the object store; ``slice_batches`` does the same on a
segment already in memory (the segment cache). Both return whole batches only: the batch
containing ``offset`` first, then following batches while they fit in ``max_bytes`` (the
first batch is returned even when it alone exceeds ``max_bytes``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from protocol.batch import BATCH_HEADER_SIZE, BatchHeader, read_header
from segments.format import (
    FOOTER_SIZE,
    HEADER_SIZE,
    CorruptSegmentError,
    IndexEntry,
    body_end,
    index_key_for,
    index_trailer_length,
    iter_segment_batches,
    lookup,
    parse_index,
)
from segments.store import Buffer, ObjectStore

log = logging.getLogger(__name__)

MIN_READ = 64 * 1024  # smallest ranged GET while looking for the batch holding an offset
TAIL_READ = 64 * 1024  # the object's tail read with its header for the index (~5,000 entries)
_EMPTY = memoryview(b"")


@dataclass(frozen=True, slots=True)
class BatchPosition:
    position: int  # byte position of the batch start in the segment file
    header: BatchHeader


def _start_position(index: Sequence[IndexEntry] | None, offset: int) -> int:
    if index:
        entry = lookup(index, offset)
        if entry is not None:
            return entry.position
    return HEADER_SIZE


def _header_at(buf: memoryview, rel: int, pos: int, body_end: int) -> BatchHeader:
    hdr = read_header(buf, rel)
    if hdr.magic != 2 or hdr.size < BATCH_HEADER_SIZE or pos + hdr.size > body_end:
        raise CorruptSegmentError(f"bad record batch framing at byte {pos}")
    return hdr


def _collect(buf: memoryview, rel: int, pos: int, first_size: int, limit: int) -> int:
    """Bytes of whole batches from ``rel`` in ``buf``: the first batch, then those that fit."""
    total = first_size
    while rel + total + BATCH_HEADER_SIZE <= len(buf):
        size = read_header(buf, rel + total).size
        if total + size > limit or rel + total + size > len(buf):
            break
        total += size
    return total


def slice_batches(
    data: Buffer, index: Sequence[IndexEntry] | None, offset: int, max_bytes: int
) -> memoryview:
    """Whole batches from an in-memory segment (a view into ``data``, no copy)."""
    view = memoryview(data)
    end = body_end(view)
    pos = _start_position(index, offset)
    while pos < end:
        if end - pos < BATCH_HEADER_SIZE:
            raise CorruptSegmentError(f"truncated batch header at byte {pos}")
        hdr = _header_at(view, pos, pos, end)
        if hdr.last_offset >= offset:
            total = _collect(view[:end], pos, pos, hdr.size, max_bytes)
            return view[pos : pos + total]
        pos += hdr.size
    return _EMPTY


async def read_from(
    store: ObjectStore,
    key: str,
    index: list[IndexEntry] | None,
    offset: int,
    max_bytes: int,
    size: int,
    etag: str | None,
    trailer: int = 0,
) -> memoryview:
    """Whole batches from ``offset`` via ranged GETs (If-Match ``etag``).

    ``size`` is the segment object's size, ``trailer`` the length of its index trailer
    (version 2; ``load_index`` says). Returns an empty view when ``offset`` is past
    the segment's last offset. Raises CorruptSegmentError on bad framing, and the store's
    errors (ObjectNotFoundError, PreconditionFailedError, StoreError) unchanged.
    """
    body_end = size - FOOTER_SIZE - trailer
    pos = _start_position(index, offset)
    chunk = max(max_bytes, MIN_READ)
    buf = _EMPTY
    buf_start = pos
    # Phase 1: walk headers from the indexed position to the batch holding ``offset``.
    while True:
        if pos >= body_end:
            return _EMPTY
        if body_end - pos < BATCH_HEADER_SIZE:
            raise CorruptSegmentError(f"truncated batch header at byte {pos}")
        if pos + BATCH_HEADER_SIZE > buf_start + len(buf):
            buf_start = pos
            buf = memoryview(await store.get(key, pos, min(body_end, pos + chunk), etag))
        hdr = _header_at(buf, pos - buf_start, pos, body_end)
        if hdr.last_offset >= offset:
            break
        pos += hdr.size
    # Phase 2: make sure the buffer covers the first batch and up to max_bytes after pos.
    want_end = max(pos + hdr.size, min(body_end, pos + max_bytes))
    have_end = buf_start + len(buf)
    if want_end > have_end:
        more = await store.get(key, have_end, want_end, etag)
        buf = memoryview(b"".join((buf[pos - buf_start :], more)))
        buf_start = pos
    rel = pos - buf_start
    total = _collect(buf[: want_end - buf_start], rel, pos, hdr.size, max_bytes)
    return buf[rel : rel + total]


async def load_index(
    store: ObjectStore, key: str, size: int, etag: str | None
) -> tuple[list[IndexEntry], int]:
    """The sparse index of a stored segment without reading its body, and the length of
    its index trailer (docs/format.md). The header and the object's last ``TAIL_READ``
    bytes are read at once: a version 2 segment's trailer is in that tail unless its index
    is huge (then its exact range is read); a version 1 segment's index is the ``.index``
    object beside it. The segment's ranges are read by the store's ``get_buffer`` where it
    has one (S3: direct GETs, not the SDK's, whose per-request CPU was ~15 % of a cold
    read's broker samples: docs/benchmarks.md, Round 4: cold reads)."""
    get = getattr(store, "get_buffer", store.get)
    tail_len = min(size - HEADER_SIZE, TAIL_READ)
    head, tail = await asyncio.gather(
        get(key, 0, HEADER_SIZE, etag), get(key, size - tail_len, size, etag)
    )
    trailer = index_trailer_length(head, size)
    if not trailer:
        return parse_index(await store.get(index_key_for(key))), 0
    if trailer + FOOTER_SIZE <= len(tail):
        return parse_index(memoryview(tail)[-FOOTER_SIZE - trailer : -FOOTER_SIZE]), trailer
    end = size - FOOTER_SIZE
    return parse_index(await get(key, end - trailer, end, etag)), trailer


def scan_segment(data: Buffer) -> list[BatchPosition]:
    """Positions and headers of every batch of an in-memory segment."""
    return [BatchPosition(pos, hdr) for pos, hdr, _ in iter_segment_batches(data)]


async def scan_batch_headers(
    store: ObjectStore, key: str, etag: str | None = None
) -> list[BatchPosition]:
    """Every batch header of a stored segment (producer-state rebuild, timestamp lookup).

    Reads the whole object with one GET (one round trip beats a GET per header on S3).
    """
    data = await store.get(key, None, None, etag)
    return scan_segment(data)


def find_offset_for_timestamp(batches: Sequence[BatchPosition], timestamp: int) -> int | None:
    """ListOffsets by time: the base offset of the first batch whose max timestamp is
    at or after ``timestamp`` (None when every batch is older)."""
    for b in batches:
        if b.header.max_timestamp >= timestamp:
            return b.header.base_offset
    return None
