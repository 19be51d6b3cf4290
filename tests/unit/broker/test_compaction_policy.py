"""Log compaction policy, no I/O: broker/compaction_policy.py and protocol/compaction.py
(latest per key, tombstone horizons, lag bounds, dirty ratio, a small key map over several
passes, batch rebuilding), compacted segment framing (segments/format.py), and a property
test: compaction of any log equals "last value per key" applied to that log."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.compaction_policy import (
    NO_TOMBSTONES,
    CompactionConfig,
    KeyMap,
    RecordFilter,
    cleanable_count,
    collapse,
    dirty_state,
    horizon_at,
    is_due,
    rewrite_batches,
)
from broker.partition import SegmentMeta
from protocol.batch import read_header
from protocol.compaction import first_keyless, rebuild_batch, split_records
from protocol.compression import Compression
from protocol.errors import ErrorCode
from protocol.records import build_batch, decode_batch
from protocol.validate import BatchRejected
from segments.format import iter_segment_batches
from segments.validate import validate_segment


def seg(base: int, last: int, size: int = 100, ts: int = 0, cleaned: Any = ()) -> SegmentMeta:
    return SegmentMeta(base, last, size, last - base + 1, ts, f"e{base}", "", ts, tuple(cleaned))


# ------------------------------------------------------------------- pure policy


def test_cleanable_never_young_segments() -> None:
    segs = [seg(0, 9, ts=1000), seg(10, 19, ts=2000), seg(20, 29, ts=3000)]
    assert cleanable_count(segs, 10_000, 0) == 3
    assert cleanable_count(segs, 2_500, 1000) == 1  # min.compaction.lag.ms
    assert cleanable_count(segs, 1_500, 1000) == 0


def test_dirty_ratio_and_due() -> None:
    clean = seg(0, 9, size=300, ts=1000, cleaned=[(0, NO_TOMBSTONES)])
    segs = [clean, seg(10, 19, size=100, ts=2000), seg(20, 29, size=100, ts=3000)]
    cfg = CompactionConfig(True, dirty_ratio=0.5, min_lag_ms=7500)
    state = dirty_state(segs, 10_000, cfg)
    assert (state.clean, state.end, state.clean_bytes, state.dirty_bytes) == (1, 2, 300, 100)
    assert state.ratio == pytest.approx(0.25)
    assert not is_due(state, segs, 10_000, cfg)
    assert is_due(state, segs, 10_000, CompactionConfig(True, dirty_ratio=0.2))
    # max.compaction.lag.ms: the oldest cleanable dirty record (written at 2000) waited
    lagged = CompactionConfig(True, dirty_ratio=0.9, min_lag_ms=3500, max_lag_ms=5000)
    assert is_due(dirty_state(segs, 7_000, lagged), segs, 7_000, lagged)
    assert not is_due(dirty_state(segs, 6_999, lagged), segs, 6_999, lagged)
    # nothing dirty, but a tombstone horizon passed: due (the tombstone must go)
    tomb = [seg(0, 9, ts=1000, cleaned=[(0, NO_TOMBSTONES), (5, 2000)]), seg(10, 10, ts=9000)]
    cfg = CompactionConfig(True, delete_retention_ms=1000)
    assert is_due(dirty_state(tomb, 3000, cfg), tomb, 3000, cfg)
    assert not is_due(dirty_state(tomb, 2999, cfg), tomb, 2999, cfg)


def test_horizons() -> None:
    pairs = collapse([(0, NO_TOMBSTONES), (5, 100), (7, 100), (9, 200)])
    assert pairs == ((0, NO_TOMBSTONES), (5, 100), (9, 200))
    assert horizon_at(pairs, 3) is None
    assert horizon_at(pairs, 7) == 100
    assert horizon_at(pairs, 12) == 200
    assert horizon_at((), 3) is None


def test_config_from_topic_configs() -> None:
    cfg = CompactionConfig.from_configs(
        {
            "cleanup.policy": "compact,delete",
            "compression.type": "zstd",
            "min.compaction.lag.ms": "7",
        }
    )
    assert cfg.compact and cfg.codec == Compression.ZSTD and cfg.min_lag_ms == 7
    assert CompactionConfig.from_configs({}).compact is False
    assert CompactionConfig.from_configs({"compression.type": "producer"}).codec is None


def test_rebuild_keeps_offsets_timestamps_headers_and_sequence_range() -> None:
    recs: list[Any] = [
        (b"a", b"1", [("h", b"x")]),
        (b"b", b"2", []),
        (b"a", None, [("h2", None)]),
        (b"c", b"3", []),
    ]
    raw = build_batch(
        recs, 100, timestamps=[5, 6, 7, 8], producer_id=9, producer_epoch=1, base_sequence=40
    )
    hdr, records = split_records(raw)
    kept = [records[1], records[2]]
    new = rebuild_batch(hdr, kept, int(Compression.GZIP))
    nh, out = decode_batch(new, check_crc=True)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in out] == [
        (101, 6, b"b", b"2", ()),
        (102, 7, b"a", None, (("h2", None),)),
    ]
    assert (nh.last_offset_delta, nh.base_sequence, nh.producer_id, nh.compression) == (
        3, 40, 9, Compression.GZIP,
    )  # fmt: skip
    assert nh.max_timestamp == 7
    empty = rebuild_batch(hdr, [], int(Compression.GZIP))
    eh, none = decode_batch(empty, check_crc=True)
    assert none == [] and eh.record_count == 0 and eh.last_offset == 103 and eh.compression == 0
    assert first_keyless(raw) is None
    assert first_keyless(build_batch([(b"k", b"v", []), (None, b"v", [])])) == 1


def test_require_keys_names_the_record() -> None:
    from protocol.compaction import require_keys

    ok = memoryview(build_batch([(b"k", b"v", [])]))
    bad = memoryview(build_batch([(b"k", b"v", []), (None, b"v", [])], 1))
    require_keys([(read_header(ok), ok)])
    with pytest.raises(BatchRejected) as info:
        require_keys([(read_header(ok), ok), (read_header(bad), bad)])
    assert info.value.code == ErrorCode.INVALID_RECORD and info.value.record_index == 2


# ------------------------------------------------------------------- property test


def _log_batches(ops: Sequence[tuple[int, bool]], per_batch: int) -> list[bytes]:
    """Batches of keyed records: op (key, tombstone?) i at offset i."""
    out = []
    for start in range(0, len(ops), per_batch):
        chunk = ops[start : start + per_batch]
        recs: list[Any] = [
            (f"k{k}".encode(), None if dead else f"v{start + i}".encode(), [])
            for i, (k, dead) in enumerate(chunk)
        ]
        out.append(build_batch(recs, start, timestamps=[start + i for i in range(len(chunk))]))
    return out


def _compact(
    batches: list[bytes], capacity: int, now: int, retention: int
) -> tuple[list[bytes], list[tuple[int, int]]]:
    """Passes of the pure pipeline until clean (one "segment" per batch): the dirty
    part is mapped as far as the key map holds, the head is rewritten up to there."""
    segs: list[tuple[list[bytes], tuple[tuple[int, int], ...] | None]] = [
        ([b], None) for b in batches
    ]
    while True:
        clean = next((i for i, (_, c) in enumerate(segs) if c is None), len(segs))
        if clean == len(segs):
            return [b for bs, _ in segs for b in bs], [p for _, c in segs for p in c or ()]
        keys = KeyMap(capacity)
        end = clean
        for i in range(clean, len(segs)):
            found = [r for b in segs[i][0] for r in split_records(b)[1]]
            if i > clean and not keys.room_for(len(found)):
                break
            keys.add(found)
            end = i + 1
        filt = RecordFilter(keys, now, retention)
        for i in range(end):
            bs, cleaned = segs[i]
            filt.cleaned = cleaned or ()
            views = [(read_header(b), memoryview(b)) for b in bs]
            rw = rewrite_batches(views, filt, None, {})
            first = read_header(bs[0]).base_offset if bs else 0
            segs[i] = (
                [bytes(b) for b in rw.batches],
                collapse([(first, NO_TOMBSTONES), *rw.tombstones]),
            )


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(st.tuples(st.integers(0, 12), st.booleans()), min_size=1, max_size=80),
    per_batch=st.integers(1, 7),
    capacity_keys=st.integers(1, 20),
)
def test_compaction_of_any_log_is_the_last_value_per_key(
    ops: list[tuple[int, bool]], per_batch: int, capacity_keys: int
) -> None:
    from broker.compaction_policy import KEY_ENTRY_BYTES

    batches = _log_batches(ops, per_batch)
    out, _ = _compact(batches, capacity_keys * KEY_ENTRY_BYTES, now=1000, retention=10**9)
    got = [(r.offset, r.key, r.value) for b in out for r in decode_batch(b, check_crc=True)[1]]
    last: dict[bytes, tuple[int, bytes | None]] = {}
    for i, (k, dead) in enumerate(ops):
        last[f"k{k}".encode()] = (i, None if dead else f"v{i}".encode())
    want = sorted((o, k, v) for k, (o, v) in last.items())
    assert got == want  # one record per key, at its original offset, tombstones kept
    # the horizons reached: a later pass with the retention passed drops the tombstones
    expired_out, _ = _compact_again(out, now=10**10, retention=1)
    got = [(r.offset, r.key, r.value) for b in expired_out for r in decode_batch(b)[1]]
    assert got == [w for w in want if w[2] is not None]


def _compact_again(batches: list[bytes], now: int, retention: int) -> tuple[list[bytes], None]:
    filt = RecordFilter(KeyMap(1 << 20), now, retention, cleaned=((0, 1),))
    views = [(read_header(b), memoryview(b)) for b in batches]
    rw = rewrite_batches(views, filt, None, {})
    return [bytes(b) for b in rw.batches], None


def test_producer_last_batch_kept_as_empty_header() -> None:
    b1 = build_batch([(b"a", b"1", [])], 0, producer_id=7, producer_epoch=0, base_sequence=0)
    b2 = build_batch([(b"a", b"2", [])], 1, producer_id=8, producer_epoch=0, base_sequence=0)
    b3 = build_batch([(b"a", b"3", [])], 2)
    keys = KeyMap(1 << 20)
    for b in (b1, b2, b3):
        keys.add(split_records(b)[1])
    filt = RecordFilter(keys, 0, 10**9)
    views = [(read_header(b), memoryview(b)) for b in (b1, b2, b3)]
    rw = rewrite_batches(views, filt, None, {7: 0, 8: 5})  # 7's last batch is b1
    hdrs = [read_header(b) for b in rw.batches]
    assert [(h.base_offset, h.record_count, h.producer_id) for h in hdrs] == [
        (0, 0, 7),
        (2, 1, -1),
    ]


def test_segment_scan_of_compacted_objects_is_ascending() -> None:
    from segments.writer import build_segment

    b1 = memoryview(build_batch([(b"a", b"1", [])], 3))
    b2 = memoryview(build_batch([(b"b", b"1", [])], 9))
    built = build_segment(0, [b1, b2], 1, compacted_last=20)
    data = b"".join(bytes(b) for b in built.buffers)
    report = validate_segment(data, built.index)
    assert report.ok, report.problems
    assert [h.base_offset for _p, h, _v in iter_segment_batches(data)] == [3, 9]
    empty = build_segment(0, [], 1, compacted_last=20)
    assert validate_segment(b"".join(bytes(b) for b in empty.buffers), empty.index).ok
    with pytest.raises(ValueError):
        build_segment(0, [b2, b1], 1, compacted_last=20)
    with pytest.raises(ValueError):
        build_segment(0, [b1, b2])  # plain segments stay contiguous
