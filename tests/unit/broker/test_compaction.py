"""Log compaction: the pure policy (broker/compaction_policy.py, protocol/compaction.py), a
property test against "last value per key", and passes of the compactor
(broker/compaction.py) on an in-process broker over a real local-directory store and a
real embedded metadata store."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
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
from broker.logs import LogManager
from broker.partition import PartitionLog, SegmentMeta
from broker.server import Broker
from protocol.batch import iter_batches, read_header
from protocol.compaction import first_keyless, rebuild_batch, split_records
from protocol.compression import Compression
from protocol.errors import ErrorCode
from protocol.records import build_batch, decode_batch
from protocol.validate import BatchRejected
from segments.format import index_key_for, iter_segment_batches, validate_segment
from tests.fixtures.inprocess import local_config

TOPIC = "compacted"
COMPACT = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"}


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


# ------------------------------------------------------------------- in-process passes


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Broker]:
    cfg = local_config(
        tmp_path,
        merge_interval_ms=3_600_000,
        retention_check_interval_ms=3_600_000,
        segment_delete_grace_ms=0,
    )
    b = Broker(cfg)
    await b.start()
    await b.topics.create(TOPIC, 1, configs=COMPACT)
    try:
        yield b
    finally:
        await b.stop()


async def append(logs: LogManager, recs: list[Any], **kw: Any) -> None:
    """One committed batch (= one segment)."""
    lg = await logs.get(TOPIC, 0)
    view = memoryview(bytearray(build_batch(recs, **kw)))
    res = lg.append(read_header(view), view)
    assert res.error == ErrorCode.NONE and res.done is not None
    logs.appended(lg, len(view))
    await res.done


async def read_records(logs: LogManager, lg: PartitionLog) -> list[tuple[int, bytes, Any]]:
    out: list[tuple[int, bytes, Any]] = []
    offset = 0
    while offset < lg.hw:
        views = await logs.read(lg, offset, 1 << 20)
        if not views:
            break
        for v in views:
            for hdr, bv in iter_batches(v):
                out += [
                    (r.offset, r.key, r.value) for r in decode_batch(bv)[1] if r.offset >= offset
                ]
                offset = max(offset, hdr.last_offset + 1)
    return out


async def test_pass_keeps_latest_per_key_at_original_offsets(node: Broker) -> None:
    logs = node.logs
    for v in range(4):
        await append(logs, [(f"k{k}".encode(), f"v{v}".encode(), []) for k in range(3)])
    await append(logs, [(b"k0", None, [])])  # a tombstone at offset 12
    await append(logs, [(b"k1", b"x", []), (b"k1", b"tail", [])])  # the last batch stays whole
    lg = await logs.get(TOPIC, 0)
    assert logs.maintenance is not None
    comp = logs.maintenance.compactor
    cfg = comp.topic_config(lg)
    assert cfg is not None
    assert await comp.compact(lg, cfg)
    got = await read_records(logs, lg)
    assert got == [(11, b"k2", b"v3"), (12, b"k0", None), (13, b"k1", b"x"), (14, b"k1", b"tail")]
    assert lg.segments[0].cleaned and lg.segments[0].base == 0 and lg.segments[-1].last == 14
    assert lg.hw == 15
    # Fetch at a removed offset returns the next batch
    views = await logs.read(lg, 3, 1 << 20)
    assert read_header(views[0]).base_offset >= 3
    # the stored objects are valid compacted segments; the entry names one
    data = await logs.segment_batches(lg, lg.segments[0])
    index = await node.store.get(index_key_for(logs.object_key(lg, lg.segments[0])))
    report = validate_segment(data, index)
    assert report.ok, report.problems
    assert report.header is not None and report.header.compacted
    from segments.inspect import main as inspect_main
    from segments.inspect import verify_batches

    assert verify_batches(data, report) == []  # kafscale segments inspect --verify
    path = node.config.data_dir + "/" + logs.object_key(lg, lg.segments[0])
    assert inspect_main([path, "--verify"]) == 0
    kv = await node.meta.get(f"/logs/{TOPIC}/0/segments/{0:020d}")
    assert kv is not None and json.loads(kv.value)["cleaned"][0] == [0, NO_TOMBSTONES]
    # the tombstone goes delete.retention.ms after compaction reached it
    later = int(time.time() * 1000) + 86_400_000 + 1000
    assert await comp.maybe_compact(lg, now_ms=later)
    assert [r[0] for r in await read_records(logs, lg)] == [11, 13, 14]


async def test_small_key_map_compacts_in_several_passes(node: Broker) -> None:
    from broker.compaction_policy import KEY_ENTRY_BYTES

    logs = node.logs
    for v in range(6):
        await append(logs, [(f"k{k}".encode(), f"v{v}".encode(), []) for k in range(4)])
    lg = await logs.get(TOPIC, 0)
    assert logs.maintenance is not None
    comp = logs.maintenance.compactor
    from dataclasses import replace

    comp.config = replace(node.config, compaction_buffer_bytes=4 * KEY_ENTRY_BYTES)
    cfg = comp.topic_config(lg)
    assert cfg is not None
    passes = 0
    while await comp.compact(lg, cfg):
        passes += 1
        assert passes < 10
    assert passes >= 2  # one dirty segment (4 keys) per pass
    got = await read_records(logs, lg)
    assert got == [(20 + k, f"k{k}".encode(), b"v5") for k in range(4)]


async def test_policy_change_takes_effect_on_a_live_topic(node: Broker) -> None:
    logs = node.logs
    await node.topics.alter_configs(TOPIC, {"cleanup.policy": "delete"})
    for v in range(3):
        await append(logs, [(b"k", f"v{v}".encode(), [])])
    lg = await logs.get(TOPIC, 0)
    assert logs.maintenance is not None
    comp = logs.maintenance.compactor
    assert comp.topic_config(lg) is None
    assert not await comp.maybe_compact(lg)
    await node.topics.alter_configs(TOPIC, {"cleanup.policy": "compact,delete"})
    assert await comp.maybe_compact(lg)
    assert [r[2] for r in await read_records(logs, lg)] == [b"v2"]


def test_segment_scan_of_compacted_objects_is_ascending() -> None:
    from segments.format import build_segment

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


async def test_producer_state_delete_records_and_list_offsets_after_compaction(
    tmp_path: Path,
) -> None:
    from broker.handlers.list_offsets import _by_timestamp, _max_timestamp

    cfg = local_config(tmp_path, segment_delete_grace_ms=0)
    b = Broker(cfg)
    await b.start()
    try:
        await b.topics.create(TOPIC, 1, configs=COMPACT)
        pid = {"producer_id": 5, "producer_epoch": 0}
        ab: list[Any] = [(b"a", b"1", []), (b"b", b"1", [])]
        await append(b.logs, ab, base_sequence=0, timestamps=[100, 101], **pid)
        await append(b.logs, ab, base_sequence=2, timestamps=[200, 201], **pid)  # 2..3
        await append(b.logs, [(b"a", b"2", []), (b"b", b"2", [])], timestamps=[300, 301])
        await append(b.logs, [(b"c", b"1", [])], timestamps=[400])
        lg = await b.logs.get(TOPIC, 0)
        assert b.logs.maintenance is not None
        comp = b.logs.maintenance.compactor
        ccfg = comp.topic_config(lg)
        assert ccfg is not None and await comp.compact(lg, ccfg)
        assert [r[0] for r in await read_records(b.logs, lg)] == [4, 5, 6]
        # ListOffsets by time finds the first remaining record at or after it
        assert await _by_timestamp(b.logs, lg, 150) == (4, 300)
        assert await _max_timestamp(b.logs, lg) == (6, 400)
    finally:
        await b.stop()
    b = Broker(cfg)  # the next owner rebuilds producer state from the compacted log
    await b.start()
    try:
        lg = await b.logs.get(TOPIC, 0)
        view = memoryview(bytearray(build_batch(ab, base_sequence=2, **pid)))
        res = lg.append(read_header(view), view)  # a retry of the last batch: a duplicate
        assert (res.error, res.base_offset) == (ErrorCode.NONE, 2)
        assert lg.next_offset == 7
        view = memoryview(bytearray(build_batch(ab, base_sequence=5, **pid)))
        res = lg.append(read_header(view), view)  # a gap after it
        assert res.error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        # DeleteRecords inside the compacted segment
        assert b.logs.maintenance is not None
        assert await b.logs.maintenance.delete_records(lg, 5) == 5
        assert [r[0] for r in await read_records(b.logs, lg) if r[0] >= 5] == [5, 6]
        assert lg.log_start == 5
    finally:
        await b.stop()


async def test_metrics_after_a_pass(node: Broker) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from broker.metrics import broker_registry, exposition

    logs = node.logs
    for v in range(3):
        await append(logs, [(b"k", b"v%d" % v, [])])
    lg = await logs.get(TOPIC, 0)
    assert logs.maintenance is not None
    comp = logs.maintenance.compactor
    assert await comp.maybe_compact(lg)
    await append(logs, [(b"k", b"v3", [])])
    assert not await comp.maybe_compact(lg, now_ms=0)  # nothing cleanable at time 0
    body, _ = exposition(broker_registry(node), None)
    samples = {
        (s.name, s.labels.get("topic")): s.value
        for fam in text_string_to_metric_families(body.decode())
        for s in fam.samples
    }
    assert samples[("kafscale_compaction_passes_total", None)] == 1
    assert samples[("kafscale_compaction_records_removed_total", None)] == 2
    assert samples[("kafscale_compaction_bytes_read_total", None)] > 0
    assert samples[("kafscale_compaction_bytes_written_total", None)] > 0
    assert samples[("kafscale_compaction_segments_replaced_total", None)] == 3
    assert samples[("kafscale_compaction_dirty_ratio", TOPIC)] == 0.0  # nothing cleanable
    assert samples[("kafscale_compaction_oldest_cleanable_age_seconds", TOPIC)] == 0
    assert await comp.maybe_compact(lg)  # the new segment is dirty: ratio > 0, then cleaned
    body, _ = exposition(broker_registry(node), None)
    assert b"kafscale_compaction_passes_total 2.0" in body
    ratio = comp.gauges[(TOPIC, 0)][0]  # seen before the pass: one dirty segment of two
    assert 0 < ratio < 1


async def test_a_fetch_reads_on_through_gaps_at_segment_ends(node: Broker) -> None:
    from dataclasses import replace

    logs = node.logs
    lg = await logs.get(TOPIC, 0)
    for v in range(4):  # one segment of two batches: (k_v), then (x) superseded later
        views = [
            memoryview(bytearray(build_batch([(b"k%d" % v, b"keep", [])]))),
            memoryview(bytearray(build_batch([(b"x", b"%d" % v, [])]))),
        ]
        done = []
        for view in views:
            res = lg.append(read_header(view), view)
            assert res.error == ErrorCode.NONE and res.done is not None
            done.append(res.done)
        logs.appended(lg, sum(len(v) for v in views))
        for d in done:
            await d
    assert len(lg.segments) == 4
    assert logs.maintenance is not None
    comp = logs.maintenance.compactor
    comp.config = replace(node.config, merge_max_bytes=1)  # one output per source
    ccfg = comp.topic_config(lg)
    assert ccfg is not None and await comp.compact(lg, ccfg)
    assert len(lg.segments) == 4 and all(s.cleaned for s in lg.segments)
    for s in lg.segments:
        await logs.segment_batches(lg, s)  # cached, as recent segments are
    views = await logs.read(lg, 0, 1 << 20)  # one read returns every remaining batch
    got = [
        (r.offset, r.value) for v in views for _h, b in iter_batches(v) for r in decode_batch(b)[1]
    ]
    assert got == [(0, b"keep"), (2, b"keep"), (4, b"keep"), (6, b"keep"), (7, b"3")]


async def test_partitions_truncate_keeps_a_compacted_segment_compacted(tmp_path: Path) -> None:
    from broker.meta.base import open_meta
    from broker.repair import Target, truncate
    from segments.store import open_store

    cfg = local_config(tmp_path)
    b = Broker(cfg)
    await b.start()
    try:
        await b.topics.create(TOPIC, 1, configs=COMPACT)
        for v in range(3):  # offsets 3v..3v+2: a, b, c_v; a and b superseded until v=2
            await append(
                b.logs, [(b"a", b"%d" % v, []), (b"b", b"%d" % v, []), (b"c%d" % v, b"c", [])]
            )
        lg = await b.logs.get(TOPIC, 0)
        assert b.logs.maintenance is not None
        comp = b.logs.maintenance.compactor
        ccfg = comp.topic_config(lg)
        assert ccfg is not None and await comp.compact(lg, ccfg)
        assert [r[0] for r in await read_records(b.logs, lg)] == [2, 5, 6, 7, 8]
    finally:
        await b.stop()
    meta = open_meta("embedded", cfg.data_dir)
    store = open_store(cfg.store_url)
    try:  # cut at the start of the last batch (6): the segment keeps its gaps
        done = await truncate(meta, store, Target("default", TOPIC, 0), 6, execute=True)
        assert done[-1].endswith("now ends at 6")
    finally:
        await store.close()
        await meta.close()
    b = Broker(cfg)
    await b.start()
    try:
        lg = await b.logs.get(TOPIC, 0)
        assert lg.hw == 6 and lg.segments[0].cleaned
        assert [r[0] for r in await read_records(b.logs, lg)] == [2, 5]
    finally:
        await b.stop()


async def test_throttle_paces_to_the_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    from broker import compaction

    asked: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        asked.append(seconds)

    monkeypatch.setattr(compaction.asyncio, "sleep", fake_sleep)
    t = compaction.Throttle(1000)  # 1 kB/s
    t.start -= 100  # 100 s have passed
    await t.consume(500_000)  # 500 s worth: wait about 400 s more
    assert len(asked) == 1 and 390 < asked[0] <= 400
    await compaction.Throttle(0).consume(10**9)  # 0: unlimited
    assert len(asked) == 1


async def test_chunked_swaps_in_offset_order_and_a_failed_chunk_ends_the_pass(
    node: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataclasses import replace

    logs = node.logs
    for v in range(9):  # k is updated in every segment; its tombstone comes last
        await append(logs, [(b"k", b"%d" % v, []), (b"o%d" % v, b"x", [])])
    await append(logs, [(b"k", None, []), (b"end", b"x", [])])
    lg = await logs.get(TOPIC, 0)
    assert logs.maintenance is not None
    comp = logs.maintenance.compactor
    comp.config = replace(node.config, merge_max_bytes=1)  # one output per source
    monkeypatch.setattr(node.meta, "max_txn_ops", 4)  # chunks of 3 segments
    real_commit = comp._commit
    calls: list[int] = []

    async def failing_second(lg_: PartitionLog, chunk: Any) -> bool:
        calls.append(len(chunk))
        if len(calls) == 2:
            await logs.discard(lg_, [logs.object_key(lg_, m) for _, m in chunk])
            return False  # as when the manifest moved under the pass
        return bool(await real_commit(lg_, chunk))

    monkeypatch.setattr(comp, "_commit", failing_second)
    ccfg = comp.topic_config(lg)
    assert ccfg is not None and await comp.compact(lg, ccfg)
    assert len(calls) == 2  # nothing after the failed chunk was swapped in
    assert [bool(s.cleaned) for s in lg.segments] == [True] * 3 + [False] * 7
    monkeypatch.setattr(comp, "_commit", real_commit)
    assert await comp.compact(lg, ccfg)
    got = await read_records(logs, lg)
    assert got == [(2 * v + 1, b"o%d" % v, b"x") for v in range(9)] + [
        (18, b"k", None),
        (19, b"end", b"x"),
    ]
    assert all(s.cleaned for s in lg.segments)


async def test_rewritten_batches_take_the_topics_compression_type(node: Broker) -> None:
    logs = node.logs
    await node.topics.alter_configs(TOPIC, {"compression.type": "zstd"})
    await append(logs, [(b"a", b"1", []), (b"b", b"1", [])])  # a loses a record
    await append(logs, [(b"c", b"1", [])])  # kept whole, re-encoded all the same
    await append(logs, [(b"a", b"2", [])], compression=Compression.GZIP)  # the log's end
    lg = await logs.get(TOPIC, 0)
    assert logs.maintenance is not None
    comp = logs.maintenance.compactor
    ccfg = comp.topic_config(lg)
    assert ccfg is not None and ccfg.codec == Compression.ZSTD and await comp.compact(lg, ccfg)
    data = await logs.segment_batches(lg, lg.segments[0])
    hdrs = [h for _p, h, _v in iter_segment_batches(data)]
    assert [(h.base_offset, h.record_count, h.compression) for h in hdrs] == [
        (0, 1, Compression.ZSTD),
        (2, 1, Compression.ZSTD),
        (3, 1, Compression.GZIP),  # the batch holding the log's end stays whole
    ]
    assert [r[1:] for r in await read_records(logs, lg)] == [
        (b"b", b"1"),
        (b"c", b"1"),
        (b"a", b"2"),
    ]
