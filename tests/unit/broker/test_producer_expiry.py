"""Producer id expiration in the producer state (broker.producers): who is forgotten,
who is kept, and the last write times that snapshots and the takeover rebuild carry
(broker.meta.schema.ProducerSnapshot, broker.producer_rebuild)."""

from __future__ import annotations

import struct
import time
import uuid

from broker.meta.schema import ProducerSnapshot, SegmentMeta
from broker.partition import PartitionLog
from broker.producer_rebuild import rebuild
from broker.producers import ProducerState
from protocol.batch import read_header
from protocol.errors import ErrorCode
from protocol.records import build_batch
from segments.writer import build_segment


def test_producers_idle_since_the_cutoff_are_forgotten_and_accepted_anew() -> None:
    state = ProducerState()
    state.record(1, 0, 0, 4, 0, None, 1_000)  # idle
    state.record(2, 0, 0, 4, 5, None, 1_000)  # idle, but its transaction is open
    state.record(3, 0, 0, 4, 10, None, 5_000)  # wrote after the cutoff
    state.record(4, 0, 0, 4, 15, None, 1_000)
    state.record(4, 0, 5, 9, 20, None, 4_999)  # its newest batch counts
    assert state.idle(2_000) and not state.idle(1_000)
    assert state.expire(5_000, keep={2}) == [1, 4]
    assert sorted(p for p, _e, _s in state.describe()) == [2, 3]
    assert state.check(1, 0, 40, 40) == (ErrorCode.NONE, None)  # any sequence again
    assert state.check(3, 0, 40, 40)[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert state.last_write(3) == 5_000 and state.last_write(1) == -1


async def test_a_producer_with_a_batch_not_yet_committed_is_kept() -> None:
    lg = PartitionLog("t", 0, uuid.uuid4(), 1, b"o", 1, 0, [], [])
    batch = build_batch([(None, b"v", None)], producer_id=7, producer_epoch=0, base_sequence=0)
    before = int(time.time() * 1000)
    res = lg.append(read_header(batch), memoryview(bytearray(batch)))
    assert res.error == ErrorCode.NONE and res.done is not None
    assert before <= lg.producers.last_write(7) <= int(time.time() * 1000)
    assert lg.producers.expire(before + 10**9) == []  # in flight: its append may yet fail
    res.done.set_result(None)  # committed
    assert lg.producers.expire(before - 1) == []  # not idle yet: it lets go of the future
    dup = lg.producers.check(7, 0, 0, 0)[1]
    assert dup is not None and dup.done is None and dup.base_offset == 0  # still a duplicate
    assert lg.producers.expire(before + 10**9) == [7]


def test_an_older_snapshot_without_times_counts_its_producers_as_written_at_restore() -> None:
    timed = ProducerSnapshot(9, ((5, 1, ((0, 3, 2),), 1234),)).encode()
    assert timed[:4] == b"KPS2"
    # the same snapshot as round 8 wrote it: KPS1, no time per producer
    old = b"KPS1" + timed[4:16] + struct.pack(">qhB", 5, 1, 1) + timed[-16:]
    snap = ProducerSnapshot.decode(old)
    assert snap == ProducerSnapshot(9, ((5, 1, ((0, 3, 2),), -1),))
    state = ProducerState()
    state.restore(snap.producers, 777)
    assert state.last_write(5) == 777
    state.restore(ProducerSnapshot.decode(timed).producers, 777)
    assert state.last_write(5) == 1234


async def test_a_producer_read_back_from_a_segment_was_last_written_at_its_commit() -> None:
    segs, data = [], {}
    for base, created in ((0, 1_000), (1, 2_000)):
        batch = build_batch(
            [(None, b"v", None)],
            base_offset=base,
            producer_id=9,
            producer_epoch=0,
            base_sequence=base,
        )
        built = build_segment(base, [memoryview(batch)])
        data[base] = b"".join(bytes(b) for b in built.buffers)
        segs.append(SegmentMeta(base, base, 100, 1, -1, f"e{base}", created_ms=created))
    lg = PartitionLog("t", 0, uuid.uuid4(), 2, b"o", 1, 2, segs, [])

    async def load(seg: SegmentMeta) -> bytes:
        return data[seg.base]

    await rebuild(lg, load, lambda _segs: None, None)
    assert lg.producers.last_write(9) == 2_000
    assert lg.producers.expire(2_000) == [] and lg.producers.expire(2_001) == [9]
