"""LRU cache of whole segment objects (and their parsed indexes), bounded by bytes.

Keyed by object key. Not thread-safe by design: it lives on the broker's event loop.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass

from segments.format import IndexEntry
from segments.store import Buffer

log = logging.getLogger(__name__)

INDEX_ENTRY_COST = 64  # approximate bytes one parsed IndexEntry costs in memory


@dataclass(frozen=True, slots=True)
class CachedSegment:
    data: Buffer
    index: list[IndexEntry] | None
    etag: str | None
    cost: int  # bytes charged against the cache

    @property
    def size(self) -> int:
        return len(self.data)


class SegmentCache:
    """``get`` moves an entry to most-recently-used; ``put`` evicts least-recently-used
    entries until the total cost fits ``max_bytes``. An entry larger than ``max_bytes`` is
    not cached."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, CachedSegment] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: str, etag: str | None = None) -> CachedSegment | None:
        """The cached segment, or None. With ``etag``, an entry with another ETag is a miss
        (and is dropped: the object at that key was replaced)."""
        entry = self._entries.get(key)
        if entry is None or (etag is not None and entry.etag is not None and entry.etag != etag):
            if entry is not None:
                self.evict(key)
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry

    def put(
        self,
        key: str,
        data: Buffer,
        index: list[IndexEntry] | None = None,
        etag: str | None = None,
    ) -> bool:
        """Cache ``data`` (kept by reference: pass an immutable buffer). True if cached."""
        cost = len(data) + (len(index) * INDEX_ENTRY_COST if index else 0)
        self.evict(key)
        if cost > self.max_bytes:
            return False
        self._entries[key] = CachedSegment(data, index, etag, cost)
        self._bytes += cost
        while self._bytes > self.max_bytes:
            old_key, old = self._entries.popitem(last=False)
            self._bytes -= old.cost
            self.evictions += 1
            log.debug("segment cache evicted %s (%d bytes)", old_key, old.cost)
        return True

    def evict(self, key: str) -> bool:
        """Drop ``key``; True if it was cached."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        self._bytes -= entry.cost
        return True

    def evict_prefix(self, prefix: str) -> int:
        """Drop every key starting with ``prefix`` (a deleted topic/partition)."""
        keys = [k for k in self._entries if k.startswith(prefix)]
        for k in keys:
            self.evict(k)
        return len(keys)

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0
