"""Log compaction passes (broker/compaction.py) on an in-process broker over a real
local-directory store and a real embedded metadata store: offsets kept, tombstone
lifetime, several passes with a small key map, a policy change, metrics, reads through
gaps, pacing, chunked swaps, the topic's compression, the last stable offset. Across
owners: test_compaction_owners.py; the property test: test_compaction_property.py; the
pure policy: test_compaction_policy.py."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from broker.compaction_policy import NO_TOMBSTONES
from broker.partition import PartitionLog
from broker.server import Broker
from protocol.batch import iter_batches, read_header
from protocol.compression import Compression
from protocol.errors import ErrorCode
from protocol.records import build_batch, decode_batch
from segments.format import iter_segment_batches
from segments.validate import validate_segment
from tests.fixtures.inprocess import local_config
from tests.unit.broker.compaction_helpers import COMPACT, TOPIC, append, read_records


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


async def test_pass_keeps_latest_per_key_at_original_offsets(
    node: Broker, capsys: pytest.CaptureFixture[str]
) -> None:
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
    report = validate_segment(data)  # the index is its trailer (docs/format.md)
    assert report.ok, report.problems
    assert report.index is not None
    assert report.header is not None and report.header.compacted
    from segments.inspect import main as inspect_main
    from segments.inspect import verify_batches

    assert verify_batches(data, report) == []  # kafscale segments inspect --verify
    path = node.config.data_dir + "/" + logs.object_key(lg, lg.segments[0])
    assert inspect_main([path, "--verify"]) == 0
    assert "compacted (offsets have gaps)" in capsys.readouterr().out
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
    assert (
        samples[("kafscale_compaction_bytes_compacted_total", None)]
        == comp.stats["bytes_compacted"]
        > samples[("kafscale_compaction_bytes_written_total", None)]
    )
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
    # nothing cached: a fetch in a segment's trailing gap still returns the next batch
    # (an empty remote read does not use up the one remote read a fetch makes)
    logs.cache.evict_prefix("")
    views = await logs.read(lg, 1, 1 << 20)
    assert views and read_header(views[0]).base_offset == 2


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


async def test_compaction_stops_at_the_last_stable_offset(node: Broker) -> None:
    """An open transaction's outcome decides which record of a key is the latest: nothing
    from its first offset on is compacted until it ends (the transactions issue)."""
    from broker.meta.schema import AbortedTxn, OpenTxn
    from broker.txn_partition import state_of

    logs = node.logs
    for v in range(4):  # offsets 0-5, 6-11: below the LSO; 12-17, 18-23: above
        await append(logs, [(f"k{k}".encode(), f"v{v}".encode(), []) for k in range(6)])
    lg = await logs.get(TOPIC, 0)
    txns = await state_of(node.meta, lg)
    txns.open[77] = OpenTxn(producer_id=77, producer_epoch=0, first=12, txn_id="t")
    assert logs.maintenance is not None
    comp = logs.maintenance.compactor
    cfg = comp.topic_config(lg)
    assert cfg is not None
    assert await comp.compact(lg, cfg)
    got = await read_records(logs, lg)
    # below the LSO only the latest of each key so far (v1) is left; above it, all of it
    assert [o for o, _k, _v in got] == list(range(6, 24))
    # the transaction ends aborted: an aborted record never supersedes a committed one
    txns.open.clear()
    txns.add_aborted(AbortedTxn(producer_id=77, first=24, last=30))
    await append(
        logs,
        [(b"k0", b"aborted", [])],
        producer_id=77,
        producer_epoch=0,
        base_sequence=0,
        transactional=True,
    )
    await append(logs, [(b"k9", b"tail", [])])
    assert await comp.compact(lg, cfg)
    got = await read_records(logs, lg)
    k0 = [(o, v) for o, k, v in got if k == b"k0"]
    assert (18, b"v3") in k0  # the last committed k0 is kept
