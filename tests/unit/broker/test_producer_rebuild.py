"""Which segments a takeover reads to rebuild idempotent-producer state
(broker.producer_rebuild.window)."""

from __future__ import annotations

from broker.meta.schema import SegmentMeta
from broker.producer_rebuild import MAX_SEGMENTS, MIN_SEGMENTS, WINDOW_BYTES, window


def _segs(sizes: list[int]) -> list[SegmentMeta]:
    return [SegmentMeta(i * 10, i * 10 + 9, size, 10, -1, f"e{i}") for i, size in enumerate(sizes)]


def test_small_segments_are_read_back_to_the_byte_window() -> None:
    segs = _segs([1 << 20] * 40)
    picked = window(segs)
    assert picked == segs[-16:]  # 16 x 1 MiB = WINDOW_BYTES, oldest first
    assert sum(s.size for s in picked) == WINDOW_BYTES


def test_at_least_the_newest_few_even_when_they_are_large() -> None:
    segs = _segs([WINDOW_BYTES] * 10)
    assert window(segs) == segs[-MIN_SEGMENTS:]


def test_tiny_segments_stop_at_the_count_limit_and_short_logs_are_read_whole() -> None:
    tiny = _segs([100] * (MAX_SEGMENTS + 30))
    assert window(tiny) == tiny[-MAX_SEGMENTS:]
    short = _segs([100, 200])
    assert window(short) == short and window([]) == []
