"""Persisted producer snapshots: their codec (broker.meta.schema.ProducerSnapshot), what
the owner puts in one (ProducerState.snapshot), when it writes one
(broker.producer_snapshot) and how a new owner uses one (broker.producer_rebuild)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from broker.meta.base import open_meta
from broker.meta.schema import ProducerSnapshot, SegmentMeta, owner_key, producers_key
from broker.partition import PartitionLog
from broker.producer_rebuild import MAX_SEGMENTS, REPLAY_MAX_SEGMENTS, rebuild
from broker.producer_snapshot import (
    SNAPSHOT_BYTES,
    SNAPSHOT_FULL,
    SNAPSHOT_LIMIT,
    SNAPSHOT_SEGMENTS,
    due,
    put_op,
    write,
)
from broker.producers import ProducerState
from protocol.errors import ErrorCode
from protocol.records import build_batch
from segments.writer import build_segment


def test_the_codec_round_trips_and_refuses_anything_but_a_whole_snapshot() -> None:
    snap = ProducerSnapshot(
        1234,
        (
            (7, 2, ((90, 94, 1190), (95, 99, 1200)), 1_700_000_000_123),
            (2**40, 0, ((-1, 4, -1),), -1),
        ),
    )
    raw = snap.encode()
    assert len(raw) == 16 + 2 * 19 + 3 * 16
    assert ProducerSnapshot.decode(raw) == snap
    assert ProducerSnapshot.decode(ProducerSnapshot(0, ()).encode()) == ProducerSnapshot(0, ())
    empty = ProducerSnapshot(0, ((1, 0, (), 5),)).encode()  # a producer without batches
    for bad in (raw[:-1], raw + b"x", b"KPS3" + raw[4:], b"KPS1" + raw[4:], b"", b"{}", empty):
        with pytest.raises(ValueError):
            ProducerSnapshot.decode(bad)


def test_a_snapshot_holds_each_producers_last_committed_batch() -> None:
    state = ProducerState()
    state.record(1, 0, 0, 4, 0, None, 0)
    state.record(1, 0, 5, 9, 5, None, 0)
    state.record(1, 0, 10, 14, 10, None, 0)  # at the snapshot's offset: not committed
    state.record(2, 3, 0, 0, 20, None, 0)  # only a batch above it
    state.record(4, 0, 0, 1, 30, None, 0)
    state.rollback(30, {4: (0, 0, 30)})  # every batch of producer 4 failed: a floor
    assert sorted(state.snapshot(10, 10)) == [
        (1, 0, ((0, 4, 0), (5, 9, 5)), 0),
        (2, 3, ((-1, -1, -1),), 0),  # its place: before its first batch, committed or not
        (4, 0, ((-1, -1, -1),), 0),
    ]
    state.record(5, 0, 7, 9, 40, None, 0)
    assert (5, 0, ((-1, 6, -1),), 0) in state.snapshot(40, 10)


def test_a_capped_snapshot_keeps_floors_and_the_most_recently_written() -> None:
    state = ProducerState()
    for pid in range(10):  # written in turn, producer 3 last of all
        state.record(pid, 0, 0, 0, pid * 10, None, 1000 + (50 if pid == 3 else pid))
    state.record(99, 0, 0, 0, 200, None, 0)
    state.rollback(200, {99: (0, 0, 200)})
    assert [e[0] for e in state.snapshot(1000, 4)] == [99, 3, 9, 8]


def test_past_the_first_producers_a_snapshot_keeps_each_ones_last_batch_only() -> None:
    state = ProducerState()
    for pid in range(4):  # producer 3 wrote last
        for seq in range(3):
            state.record(pid, 0, seq, seq, pid * 10 + seq, None, 1000 + pid)
    assert state.snapshot(1000, 3, 1) == [
        (3, 0, ((0, 0, 30), (1, 1, 31), (2, 2, 32)), 1003),
        (2, 0, ((2, 2, 22),), 1002),  # its place and its last batch
        (1, 0, ((2, 2, 12),), 1001),
    ]
    restored = ProducerState()
    restored.restore(state.snapshot(1000, 3, 1), 0)
    assert restored.check(2, 0, 3, 3) == (ErrorCode.NONE, None)
    assert restored.check(2, 0, 4, 4)[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    dup = restored.check(1, 0, 2, 2)[1]
    assert dup is not None and dup.base_offset == 12
    assert restored.check(0, 0, 9, 9) == (ErrorCode.NONE, None)  # left out: unknown


def test_the_largest_snapshot_stays_under_a_megabyte() -> None:
    lg = _log([100])
    for pid in range(SNAPSHOT_LIMIT + 100):
        for seq in range(5):
            lg.producers.record(pid, 0, seq, seq, 0, None, pid)
    op = put_op(lg)
    assert op is not None and len(op.value) < 1 << 20
    snap = ProducerSnapshot.decode(op.value)
    assert len(snap.producers) == SNAPSHOT_LIMIT
    assert sum(len(p[2]) == 5 for p in snap.producers) == SNAPSHOT_FULL
    assert min(p[3] for p in snap.producers) == 100  # the 100 written first left out


def test_a_restored_producer_goes_on_from_its_last_sequence_and_knows_its_retries() -> None:
    state = ProducerState()
    state.restore([(5, 2, ((30, 35, 690), (36, 41, 700)), 1234)], 5678)
    assert state.last_write(5) == 1234
    assert state.check(5, 2, 43, 43)[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert state.check(5, 1, 42, 42)[0] == ErrorCode.INVALID_PRODUCER_EPOCH
    assert state.check(5, 2, 42, 50) == (ErrorCode.NONE, None)
    for first, last, base in ((30, 35, 690), (36, 41, 700)):  # retries: duplicates
        dup = state.check(5, 2, first, last)[1]
        assert dup is not None and dup.base_offset == base
    assert state.last_bases() == {5: 700}


def _segments(seqs: list[int], pid: int = 9) -> tuple[list[SegmentMeta], dict[int, bytes]]:
    """One segment per entry of ``seqs``, each one batch of ``pid`` at offset = index
    (a negative sequence: a plain producer's batch)."""
    segs, data = [], {}
    for base, seq in enumerate(seqs):
        batch = build_batch(
            [(None, b"v", None)],
            base_offset=base,
            producer_id=pid if seq >= 0 else -1,
            producer_epoch=0 if seq >= 0 else -1,
            base_sequence=seq,
        )
        built = build_segment(base, [memoryview(batch)])
        data[base] = b"".join(bytes(b) for b in built.buffers)
        segs.append(SegmentMeta(base, base, 100, 1, -1, f"e{base}"))
    return segs, data


async def _rebuilt(
    seqs: list[int], stored: bytes | None, log_start: int = 0
) -> tuple[PartitionLog, list[int]]:
    segs, data = _segments(seqs)
    lg = PartitionLog("t", 0, uuid.uuid4(), 2, b"o", 1, len(seqs), segs, [], log_start)
    loaded: list[int] = []

    async def load(seg: SegmentMeta) -> bytes:
        loaded.append(seg.base)
        return data[seg.base]

    await rebuild(lg, load, lambda _segs: None, stored)
    return lg, loaded


async def test_a_new_owner_knows_a_producer_older_than_the_window_from_the_snapshot() -> None:
    plain = [-1] * (MAX_SEGMENTS + 10)
    snap = ProducerSnapshot(MAX_SEGMENTS, ((5, 0, ((10, 17, 3),), 0),))
    lg, loaded = await _rebuilt(plain, snap.encode())
    assert loaded == list(range(MAX_SEGMENTS, MAX_SEGMENTS + 10))  # from the snapshot on
    assert lg.producers.describe() == [(5, 0, 17)]
    assert lg.producers.check(5, 0, 20, 20)[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert lg.snapshot_upto == MAX_SEGMENTS
    lg, _ = await _rebuilt(plain, None)  # without it: unknown, accepted at any sequence
    assert lg.producers.describe() == [] and lg.snapshot_upto == -1


async def test_batches_from_the_snapshots_offset_on_are_replayed_over_it() -> None:
    # producer 9 wrote sequences 0..5 at offsets 0..5; the snapshot was taken at 3
    snap = ProducerSnapshot(3, ((9, 0, ((0, 0, 0), (1, 1, 1), (2, 2, 2)), 0),))
    lg, loaded = await _rebuilt([0, 1, 2, 3, 4, 5], snap.encode())
    assert loaded == [3, 4, 5]
    assert lg.producers.describe() == [(9, 0, 5)]
    assert lg.producers.check(9, 0, 4, 4)[1] is not None  # a retry of offset 4: duplicate
    assert lg.producers.check(9, 0, 6, 6) == (ErrorCode.NONE, None)


async def test_a_producer_whose_last_batch_is_below_the_log_start_is_evicted() -> None:
    snap = ProducerSnapshot(
        4,
        (
            (1, 0, ((9, 9, 1),), 0),
            (2, 0, ((8, 8, 0), (9, 9, 3)), 0),
            (3, 0, ((-1, 9, -1),), 0),
        ),
    )
    lg, _ = await _rebuilt([-1] * 6, snap.encode(), log_start=2)
    assert sorted(p for p, _e, _s in lg.producers.describe()) == [2, 3]
    lg, _ = await _rebuilt([-1] * 6, snap.encode(), log_start=5)  # past the snapshot too
    assert lg.producers.describe() == []


@pytest.mark.parametrize("why", ["past the end", "too far behind", "garbage"])
async def test_a_snapshot_that_cannot_be_used_falls_back_to_the_window(why: str) -> None:
    n = REPLAY_MAX_SEGMENTS + 5
    seqs = [-1] * n
    seqs[-1] = 0  # producer 9 in the newest segment
    stored = {
        "past the end": ProducerSnapshot(n + 1, ((5, 0, ((17, 17, 3),), 0),)).encode(),
        "too far behind": ProducerSnapshot(0, ((5, 0, ((-1, 17, -1),), 0),)).encode(),
        "garbage": b"\x00garbage",
    }[why]
    lg, loaded = await _rebuilt(seqs, stored)
    assert len(loaded) == MAX_SEGMENTS  # the window, as without a snapshot
    assert lg.producers.describe() == [(9, 0, 0)]
    assert lg.snapshot_upto == -2 and due(lg)  # written afresh by the next pass


def _log(seg_sizes: list[int]) -> PartitionLog:
    segs = [SegmentMeta(i, i, size, 1, -1, f"e{i}") for i, size in enumerate(seg_sizes)]
    return PartitionLog("t", 0, uuid.uuid4(), 1, b"o", 1, len(segs), segs, [])


def test_a_snapshot_is_due_for_producers_never_snapshotted_and_after_enough_segments() -> None:
    lg = _log([100] * 40)
    assert not due(lg)  # no snapshot, no producer: nothing to keep
    lg.producers.record(1, 0, 0, 0, 3, None, 0)
    assert due(lg)
    lg.snapshot_upto = 40 - SNAPSHOT_SEGMENTS + 1  # SNAPSHOT_SEGMENTS - 1 segments since
    assert not due(lg)
    lg.snapshot_upto -= 1
    assert due(lg)
    big = _log([SNAPSHOT_BYTES // 2, SNAPSHOT_BYTES // 2, 100])
    big.snapshot_upto = 1
    assert not due(big)
    big.snapshot_upto = 0
    assert due(big)
    big.snapshot_upto = big.hw
    assert not due(big)


async def test_the_owner_writes_it_under_its_owner_value_only(tmp_path: Path) -> None:
    meta = open_meta("embedded", data_dir=str(tmp_path), prefix="/snap")
    try:
        lg = _log([100] * 3)
        await meta.put(owner_key("t", 0), b"o")
        lg.producers.record(1, 0, 0, 4, 1, None, 7)
        lg.producers.record(1, 0, 5, 5, 3, None, 9)  # at hw 3: not committed yet
        assert await write(meta, lg)
        kv = await meta.get(producers_key("t", 0))
        assert kv is not None
        assert ProducerSnapshot.decode(kv.value) == ProducerSnapshot(3, ((1, 0, ((0, 4, 1),), 9),))
        assert lg.snapshot_upto == 3 and not due(lg)
        await meta.put(owner_key("t", 0), b"someone else")  # the partition moved on
        lg.hw = 4
        assert not await write(meta, lg)
        kv = await meta.get(producers_key("t", 0))
        assert kv is not None and ProducerSnapshot.decode(kv.value).upto == 3
    finally:
        await meta.close()
