"""Which segments a takeover reads to rebuild idempotent-producer state
(broker.producer_rebuild.window)."""

from __future__ import annotations

import asyncio
import uuid

from broker.meta.schema import SegmentMeta
from broker.partition import PartitionLog
from broker.producer_rebuild import (
    MAX_SEGMENTS,
    MIN_SEGMENTS,
    WINDOW_BYTES,
    rebuild,
    window,
)
from protocol.records import build_batch
from segments.writer import build_segment


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


def _segment(base: int, seq: int, pad: int) -> tuple[SegmentMeta, bytes]:
    """One batch of producer 9 (sequence ``seq``) at ``base``; ``size`` in the entry is
    what the read-ahead counts, so it is set to ``pad``."""
    batch = build_batch(
        [(None, b"v", None)], base_offset=base, producer_id=9, producer_epoch=0, base_sequence=seq
    )
    built = build_segment(base, [memoryview(batch)])
    data = b"".join(bytes(b) for b in built.buffers)
    return SegmentMeta(base, base, pad, 1, -1, f"e{base}"), data


async def test_the_rest_of_the_window_is_read_ahead_and_records_go_in_offset_order() -> None:
    pads = [100] * 20 + [6 << 20] * 4 + [100] * 10  # small, large, small again
    pairs = [_segment(i, i, pad) for i, pad in enumerate(pads)]
    data = {seg.base: raw for seg, raw in pairs}
    lg = PartitionLog("t", 0, uuid.uuid4(), 2, b"o", 1, len(pairs), [s for s, _ in pairs], [])
    asked: list[list[int]] = []  # what was handed to the readahead before each load
    loaded: list[int] = []

    async def load(seg: SegmentMeta) -> bytes:
        loaded.append(seg.base)
        await asyncio.sleep(0)
        return data[seg.base]

    await rebuild(lg, load, lambda segs: asked.append([s.base for s in segs]))
    picked = [s.base for s in window(lg.segments)]
    assert loaded == picked  # each once, oldest first
    assert asked == [picked[i + 1 :] for i in range(len(picked))]
    assert lg.producers.describe() == [(9, 0, len(pairs) - 1)]  # the newest one last
