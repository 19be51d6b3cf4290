"""``segments.format.iter_batch_frames`` walks a segment's batches without building a
``BatchHeader`` each (round 17): over random segments, damaged ones included, it must
yield what ``iter_segment_batches`` yields (position, base offset, the same bytes) and
refuse what that refuses, with the same message."""

from __future__ import annotations

import random
import struct
from typing import Any

from protocol.records import Compression, build_batch
from segments.format import (
    HEADER_SIZE,
    CorruptSegmentError,
    iter_batch_frames,
    iter_segment_batches,
    parse_index,
)
from segments.writer import build_segment


def _segment(rng: random.Random) -> bytes:
    views, offset = [], rng.randint(0, 10**12)
    base = offset
    for _ in range(rng.randint(1, 8)):
        n = rng.randint(1, 30)
        codec = rng.choice([Compression.NONE, Compression.ZSTD])
        records: list[Any] = [(b"k", rng.randbytes(rng.randint(0, 400)), [])] * n
        data = build_batch(records, offset, compression=codec)
        views.append(memoryview(data))
        offset += n
    built = build_segment(base, views, 1, version=rng.choice([1, 2]))
    return b"".join(built.buffers)


def _damage(rng: random.Random, data: bytes) -> bytes:
    """Cut it short, or overwrite a length, a magic or any bytes of a batch header."""
    buf = bytearray(data)
    at = HEADER_SIZE + rng.randint(0, 3) * rng.randint(0, 200)
    kind = rng.randrange(4)
    if kind == 0:
        return bytes(buf[: rng.randint(HEADER_SIZE, len(buf))])
    if at + 17 > len(buf):
        return bytes(buf)
    if kind == 1:
        struct.pack_into(">i", buf, at + 8, rng.choice([-20, 0, 40, 10**6, 2**31 - 1]))
    elif kind == 2:
        buf[at + 16] = rng.choice([0, 1, 3, 255])
    else:
        buf[at : at + 17] = rng.randbytes(17)
    return bytes(buf)


def _walk(walk: object, data: bytes) -> object:
    out: list[tuple[int, int, bytes]] = []
    try:
        for pos, first, view in walk(data):  # type: ignore[operator]
            out.append((pos, first if isinstance(first, int) else first.base_offset,
                        bytes(view)))  # fmt: skip
    except CorruptSegmentError as exc:
        return out, str(exc)
    return out, None


def test_the_light_walk_matches_the_header_walk() -> None:
    rng = random.Random(1717)
    refused = 0
    for i in range(300):
        data = _segment(rng)
        if i % 2:
            data = _damage(rng, data)
        want = _walk(iter_segment_batches, data)
        assert _walk(iter_batch_frames, data) == want
        refused += want[1] is not None  # type: ignore[index]
    assert refused > 30  # the damaged half did reach the refusals


def test_a_built_segment_carries_its_index_as_entries() -> None:
    """The flush and the merges cache ``BuiltSegment.entries`` instead of parsing the
    index they just packed: the two must be the same index."""
    rng = random.Random(5)
    for _ in range(50):
        views, offset = [], 0
        for _ in range(rng.randint(1, 40)):
            n = rng.randint(1, 60)
            views.append(memoryview(build_batch([(None, b"v" * rng.randint(0, 50), [])] * n,
                                                offset)))  # fmt: skip
            offset += n
        built = build_segment(0, views, 1, rng.choice([1, 10, 100]))
        assert built.entries == parse_index(built.index)
        assert len(built.entries) >= 1
