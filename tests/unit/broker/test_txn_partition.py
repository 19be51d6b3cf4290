"""Partition-side transaction state: LSO, aborted-transaction ranges, capping at the LSO,
and the control batch the owner writes (broker.txn_partition, broker.txn_markers)."""

from __future__ import annotations

from broker.meta.schema import AbortedTxn, MarkerRequest, OpenTxn
from broker.txn_markers import control_batch
from broker.txn_partition import PartitionTxns, cap_batches
from protocol.batch import read_header, set_base_offset
from protocol.records import build_batch, decode_batch
from segments.validate import batch_kind


def test_lso_and_aborted_ranges() -> None:
    st = PartitionTxns()
    assert st.lso(50) == 50
    st.open[1] = OpenTxn(1, 0, 20, "a")
    st.open[2] = OpenTxn(2, 0, 12, "b")
    assert st.lso(50) == 12 and st.lso(10) == 10
    st.add_aborted(AbortedTxn(3, 5, 9))
    st.add_aborted(AbortedTxn(4, 30, 40))
    assert st.aborted_between(0, 12) == [(3, 5)]
    assert st.aborted_between(10, 50) == [(4, 30)]
    assert st.aborted_between(9, 31) == [(3, 5), (4, 30)]
    st.forget_below(10)
    assert st.aborted_between(0, 100) == [(4, 30)]


def _batches(*bases: int) -> memoryview:
    out = bytearray()
    for b in bases:
        raw = bytearray(build_batch([(b"k", b"v", None), (b"k", b"w", None)]))
        set_base_offset(raw, b)
        out += raw
    return memoryview(out)


def test_cap_batches_cuts_at_whole_batches() -> None:
    buf = _batches(0, 2, 4)
    size = len(buf) // 3
    assert [len(v) for v in cap_batches([buf], 100)] == [len(buf)]
    assert [len(v) for v in cap_batches([buf], 4)] == [2 * size]
    assert cap_batches([buf], 0) == []
    later = _batches(6)
    assert [len(v) for v in cap_batches([buf, later], 5)] == [len(buf)]


def test_control_batch_layout() -> None:
    raw = control_batch(MarkerRequest(42, 3, commit=True, coordinator_epoch=9))
    hdr = read_header(raw)
    assert hdr.is_control and hdr.is_transactional
    assert (hdr.producer_id, hdr.producer_epoch, hdr.base_sequence) == (42, 3, -1)
    rec = decode_batch(memoryview(raw), check_crc=True)[1][0]
    assert rec.key == b"\x00\x00\x00\x01" and rec.value == b"\x00\x00\x00\x00\x00\x09"
    assert batch_kind(hdr, memoryview(raw)) == "COMMIT"
    abort = control_batch(MarkerRequest(42, 3, commit=False))
    assert batch_kind(read_header(abort), memoryview(abort)) == "ABORT"


def test_compaction_respects_transactions() -> None:
    from broker.meta.schema import SegmentMeta
    from broker.txn_compaction import aborted_batch, cleanable_below_lso

    segs = [SegmentMeta(b, b + 9, 1, 10, 0, "") for b in (0, 10, 20)]
    assert cleanable_below_lso(segs, 3, 100) == 3
    assert cleanable_below_lso(segs, 3, 15) == 1  # the segment holding offset 15 waits
    assert cleanable_below_lso(segs, 2, 30) == 2
    st = PartitionTxns()
    st.add_aborted(AbortedTxn(7, 10, 14))
    data = bytearray(build_batch([(b"k", b"v", None)], producer_id=7, producer_epoch=0,
                                 base_sequence=0, transactional=True))  # fmt: skip
    set_base_offset(data, 12)
    assert aborted_batch(st, read_header(data))
    set_base_offset(data, 15)
    assert not aborted_batch(st, read_header(data))
    assert not aborted_batch(None, read_header(data))
    marker = bytearray(control_batch(MarkerRequest(7, 0, commit=False)))
    set_base_offset(marker, 14)
    assert not aborted_batch(st, read_header(marker))  # markers are kept by their own rule
