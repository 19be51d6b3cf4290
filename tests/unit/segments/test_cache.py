from __future__ import annotations

import pytest

from segments.cache import INDEX_ENTRY_COST, SegmentCache
from segments.format import IndexEntry


def test_lru_by_bytes() -> None:
    cache = SegmentCache(300)
    assert cache.put("a", b"x" * 100)
    assert cache.put("b", b"y" * 100)
    assert cache.get("a") is not None  # a is now most recently used
    assert cache.put("c", b"z" * 150)  # 350 > 300: evicts b (least recently used)
    assert "b" not in cache and "a" in cache and "c" in cache
    assert cache.bytes == 250 and len(cache) == 2
    assert cache.evictions == 1


def test_hits_misses_and_evict() -> None:
    cache = SegmentCache(1000)
    assert cache.get("k") is None
    cache.put("k", b"data", etag="e1")
    entry = cache.get("k")
    assert entry is not None and bytes(entry.data) == b"data" and entry.etag == "e1"
    assert (cache.hits, cache.misses) == (1, 1)
    assert cache.evict("k") and not cache.evict("k")
    assert cache.bytes == 0 and cache.get("k") is None and cache.misses == 2


def test_index_counts_against_budget() -> None:
    cache = SegmentCache(1000)
    index = [IndexEntry(i, 32 + i) for i in range(5)]
    cache.put("k", b"x" * 100, index=index)
    assert cache.bytes == 100 + 5 * INDEX_ENTRY_COST
    entry = cache.get("k")
    assert entry is not None and entry.index == index and entry.size == 100


def test_too_large_not_cached_and_replace() -> None:
    cache = SegmentCache(100)
    assert not cache.put("big", b"x" * 101)
    assert "big" not in cache and cache.bytes == 0
    cache.put("k", b"x" * 60)
    cache.put("k", b"y" * 70)  # replacing the same key does not double count
    assert cache.bytes == 70 and len(cache) == 1


def test_etag_mismatch_is_a_miss_and_drops() -> None:
    cache = SegmentCache(1000)
    cache.put("k", b"old", etag="e1")
    assert cache.get("k", etag="e2") is None
    assert "k" not in cache and cache.bytes == 0
    assert cache.get("k", etag="e1") is None


def test_evict_prefix() -> None:
    cache = SegmentCache(1000)
    for k in ("default/t/0/a", "default/t/1/a", "default/u/0/a"):
        cache.put(k, b"12345")
    assert cache.evict_prefix("default/t/") == 2
    assert len(cache) == 1 and cache.bytes == 5


def test_negative_budget_rejected() -> None:
    with pytest.raises(ValueError):
        SegmentCache(-1)
