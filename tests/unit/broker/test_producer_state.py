"""Idempotent produce on one partition (broker.partition + broker.producers): the
sequence checks of the append path, with real v2 batches."""

from __future__ import annotations

import uuid

from broker.meta.schema import SegmentMeta
from broker.partition import PartitionLog
from broker.producers import INT32_MAX, classify
from protocol.batch import iter_batches, read_header, verify_crc
from protocol.errors import ErrorCode
from protocol.records import build_batch


def _log() -> PartitionLog:
    return PartitionLog("t", 0, uuid.uuid4(), 3, b"owner", 1, 100, [], [])


def _append(
    lg: PartitionLog, n: int, pid: int = 7, epoch: int = 0, seq: int = 0
) -> tuple[ErrorCode, int, bytearray]:
    records = [(None, b"v%d" % i, None) for i in range(n)]
    raw = bytearray(
        build_batch(records, 0, producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    )
    ((hdr, view),) = iter_batches(memoryview(raw))
    res = lg.append(hdr, view)
    return res.error, res.base_offset, raw


async def test_in_order_batches_get_consecutive_offsets_and_patched_headers() -> None:
    lg = _log()
    assert _append(lg, 3, seq=0)[:2] == (ErrorCode.NONE, 100)
    err, base, raw = _append(lg, 2, seq=3)
    assert (err, base) == (ErrorCode.NONE, 103)
    hdr = read_header(raw)  # offset and leader epoch patched, length kept, CRC still valid
    assert (hdr.base_offset, hdr.partition_leader_epoch, hdr.size) == (103, 3, len(raw))
    assert verify_crc(raw) and lg.next_offset == 105 and len(lg.pending) == 2
    assert lg.producers.describe() == [(7, 0, 4)]


async def test_a_retried_batch_is_answered_with_its_first_offset_and_not_appended() -> None:
    lg = _log()
    _append(lg, 3, seq=0)
    _append(lg, 2, seq=3)
    first = lg.pending[0].future
    assert _append(lg, 3, seq=0)[:2] == (ErrorCode.NONE, 100)
    retry = build_batch(
        [(None, b"x", None)] * 3, 0, producer_id=7, producer_epoch=0, base_sequence=0
    )
    res = lg.append(*next(iter_batches(memoryview(bytearray(retry)))))
    assert res.done is first  # the duplicate waits for the original's commit
    assert lg.next_offset == 105 and len(lg.pending) == 2


async def test_gaps_old_epochs_and_new_epochs() -> None:
    lg = _log()
    _append(lg, 3, seq=0)
    assert _append(lg, 1, seq=5)[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert _append(lg, 1, seq=1)[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER  # overlaps
    assert _append(lg, 1, epoch=1, seq=4)[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert _append(lg, 1, epoch=1, seq=0)[:2] == (ErrorCode.NONE, 103)  # a new epoch
    assert _append(lg, 1, epoch=0, seq=3)[0] == ErrorCode.INVALID_PRODUCER_EPOCH
    assert _append(lg, 1, pid=8, seq=42)[:2] == (ErrorCode.NONE, 104)  # unknown: tracked
    assert _append(lg, 1, pid=8, seq=44)[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert lg.next_offset == 105


async def test_only_the_last_five_batches_are_duplicates() -> None:
    lg = _log()
    for i in range(6):
        _append(lg, 1, seq=i)
    assert _append(lg, 1, seq=0)[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER  # evicted
    assert _append(lg, 1, seq=1)[:2] == (ErrorCode.NONE, 101)


def _commit_pending(lg: PartitionLog) -> None:
    pend = lg.take_pending()
    last = lg.next_offset - 1
    lg.committed(SegmentMeta(lg.hw, last, 1, last - lg.hw + 1, -1, "e"), 2, pend)


async def test_a_failed_flush_keeps_the_producers_place_in_its_sequence() -> None:
    """Five batches in flight (a client's whole window) fail together: the producer is
    not forgotten. Its next batch must be the first failed one; a later one reaching the
    broker first is out of order (accepted, it would make the client count the failed
    ones as stored, and they would be lost)."""
    lg = _log()
    for i in range(3):
        _append(lg, 2, seq=2 * i)  # sequences 0-5, committed at offsets 100-105
    _commit_pending(lg)
    for i in range(3, 8):
        _append(lg, 2, seq=2 * i)  # sequences 6-15: the window, all pending
    lg.failed(lg.take_pending(), ErrorCode.KAFKA_STORAGE_ERROR)
    assert lg.next_offset == 106 and lg.producers.describe() == [(7, 0, 5)]
    for seq in (8, 10, 14, 16):  # any batch after the failed first one
        assert _append(lg, 2, seq=seq)[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert _append(lg, 2, seq=6)[:2] == (ErrorCode.NONE, 106)  # the retry, in order
    assert _append(lg, 2, seq=8)[:2] == (ErrorCode.NONE, 108)


async def test_the_floor_comes_from_the_earliest_failed_batch_even_out_of_the_window() -> None:
    lg = _log()
    for i in range(7):  # seven pending: sequences 0 and 1 have left the last-five window
        _append(lg, 1, seq=i)
    lg.failed(lg.take_pending(), ErrorCode.KAFKA_STORAGE_ERROR)  # nothing was committed
    assert lg.next_offset == 100 and lg.producers.describe() == [(7, 0, -1)]
    assert _append(lg, 1, seq=2)[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert _append(lg, 1, seq=0)[:2] == (ErrorCode.NONE, 100)
    assert lg.producers.last_bases() == {7: 100}


async def test_a_producer_first_seen_at_a_late_sequence_keeps_that_place_after_a_failure() -> None:
    lg = _log()
    assert _append(lg, 1, pid=8, seq=42)[:2] == (ErrorCode.NONE, 100)  # unknown: tracked
    _append(lg, 1, pid=8, seq=43)
    lg.failed(lg.take_pending(), ErrorCode.KAFKA_STORAGE_ERROR)
    assert lg.producers.last_bases() == {}  # the floor names no batch to keep
    assert _append(lg, 1, pid=8, seq=43)[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert _append(lg, 1, pid=8, seq=42)[:2] == (ErrorCode.NONE, 100)


async def test_sequence_wraps_at_int32_max() -> None:
    lg = _log()
    assert _append(lg, 2, seq=INT32_MAX - 1)[0] == ErrorCode.NONE
    assert _append(lg, 1, seq=0)[:2] == (ErrorCode.NONE, 102)
    assert classify(None, 0, 5, 6) == (ErrorCode.NONE, None)
