"""``segments.writer._frame`` reads batch headers as tuples (round 16): it must learn
exactly what the ``BatchHeader``-based walk it replaced learned, and refuse exactly what
that refused, with the same message. The reference below is that walk, kept verbatim."""

from __future__ import annotations

import random
import struct

import pytest

from protocol.batch import CRC_START, crc32c, read_header
from protocol.crc32c_combine import crc32c_combine
from protocol.records import Compression, build_batch
from segments.format import COMBINE_MIN, IndexEntry
from segments.writer import _Body, _frame


def _reference(
    base_offset: int,
    batches: list[memoryview],
    index_interval: int,
    compacted: bool,
    batch_crcs: list[int] | None,
) -> _Body:
    if batch_crcs is not None and len(batch_crcs) != len(batches):
        raise ValueError(f"{len(batch_crcs)} batch CRCs for {len(batches)} batches")
    out = _Body(next_offset=base_offset)
    expected = base_offset
    since_index = 0
    for i, view in enumerate(batches):
        hdr = read_header(view)
        if hdr.magic != 2 or hdr.size != len(view):
            raise ValueError(f"batch {i} is not exactly one v2 record batch")
        if hdr.base_offset < expected if compacted else hdr.base_offset != expected:
            raise ValueError(
                f"batch {i} has base offset {hdr.base_offset}, expected {expected} (not contiguous)"
            )
        if i == 0 or since_index >= index_interval:
            out.entries.append(IndexEntry(hdr.base_offset, out.end))
            since_index = 0
        if batch_crcs is not None and hdr.size >= COMBINE_MIN:
            if batch_crcs[i] != hdr.crc:
                raise ValueError(f"batch {i}: the CRC given is not the batch's stored CRC")
            prefix = crc32c(view[:CRC_START], out.crc)
            out.crc = crc32c_combine(prefix, hdr.crc, hdr.size - CRC_START)
        else:
            out.crc = crc32c(view, out.crc)
        out.records += hdr.record_count
        since_index += hdr.record_count
        out.weights[hdr.compression] = out.weights.get(hdr.compression, 0) + hdr.size
        out.max_timestamp = max(out.max_timestamp, hdr.max_timestamp)
        out.end += hdr.size
        expected = hdr.last_offset + 1
    out.next_offset = expected
    return out


CODECS = [Compression.NONE, Compression.GZIP, Compression.ZSTD]


def _batches(rng: random.Random, base: int, compacted: bool) -> list[memoryview]:
    out, offset = [], base
    for _ in range(rng.randint(0, 6)):
        n = rng.randint(1, 40)
        big = rng.random() < 0.2  # some past COMBINE_MIN: their CRC is combined
        value = rng.randbytes(COMBINE_MIN // n + 100 if big else rng.randint(0, 300))
        ts = [rng.randint(-1, 2_000_000_000_000) for _ in range(n)]
        data = build_batch([(b"k", value, [])] * n, offset, compression=rng.choice(CODECS),
                           timestamps=ts, producer_id=rng.choice([-1, 7]))  # fmt: skip
        out.append(memoryview(bytearray(data)))
        offset += n + (rng.randint(0, 5) if compacted else 0)
    return out


def _outcome(fn: object, *args: object) -> object:
    try:
        return fn(*args)  # type: ignore[operator]
    except ValueError as exc:
        return ("ValueError", str(exc))


def test_the_tuple_walk_learns_and_refuses_what_the_header_walk_did() -> None:
    rng = random.Random(16)
    refused = 0
    for trial in range(400):
        compacted = rng.random() < 0.3
        base = rng.randint(0, 10**9)
        views = _batches(rng, base, compacted)
        crcs: list[int] | None = [read_header(v).crc for v in views]
        fault = rng.randrange(8) if views else 0
        if fault == 1:  # a stale CRC for one batch
            crcs = list(crcs or [])
            crcs[rng.randrange(len(views))] ^= 1
        elif fault == 2:  # not contiguous
            struct.pack_into(">q", views[-1], 0, base - 1)
        elif fault == 3:  # a magic other than 2
            views[rng.randrange(len(views))][16] = 1
        elif fault == 4:  # truncated: shorter than its length says, or than a header
            i = rng.randrange(len(views))
            views[i] = views[i][: rng.choice([10, 60, len(views[i]) - 1])]
        elif fault == 5:  # CRCs not given: every batch hashed
            crcs = None
        elif fault == 6:  # one CRC too few
            crcs = (crcs or [])[:-1]
        interval = rng.choice([1, 7, 4096])
        got = _outcome(_frame, base, views, interval, compacted, crcs)
        want = _outcome(_reference, base, views, interval, compacted, crcs)
        if isinstance(want, tuple) and fault == 4 and "truncated" in want[1]:
            # the reference's read_header said "truncated record batch header": a
            # CorruptBatchError (a ValueError); the walk now says the batch is not framed
            assert isinstance(got, tuple) and "is not exactly one v2 record batch" in got[1]
        else:
            assert got == want, (trial, fault)
        refused += isinstance(want, tuple)
    assert 50 < refused < 350  # both sides of the walk were exercised


def test_no_batches_is_an_empty_body_at_the_base() -> None:
    assert _frame(42, [], 4096, True, None) == _reference(42, [], 4096, True, None)


@pytest.mark.parametrize("interval", [1, 3])
def test_index_entries_every_interval_records(interval: int) -> None:
    views = [memoryview(bytearray(build_batch([(b"k", b"v", [])] * 2, 2 * i))) for i in range(5)]
    body = _frame(0, views, interval, False, None)
    assert body == _reference(0, views, interval, False, None)
    assert len(body.entries) == (5 if interval == 1 else 3)
