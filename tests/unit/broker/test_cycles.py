"""The rules every reader of cycle keys follows (broker/cycles.py): which entries form a
partition's chain of acknowledged, unfolded segments, and when an entry is settled."""

from __future__ import annotations

import uuid

import pytest

from broker.cycles import ChainError, chain_of, entry_settled
from broker.meta.base import KeyValue
from broker.meta.schema import CycleEntry, EndValue, SegmentMeta, TopicInfo, cycle_json, parse_cycle

TID = uuid.uuid4()


def seg(base: int, last: int) -> SegmentMeta:
    return SegmentMeta(base, last, 100, last - base + 1, 0, "etag", version=2)


def entry(
    base: int, last: int, *, epoch: int = 3, partition: int = 0, tid: str = TID.hex
) -> CycleEntry:
    return CycleEntry("t", partition, tid, epoch, seg(base, last))


def key(*entries: CycleEntry, aborted: bool = False) -> bytes:
    return cycle_json(list(entries), aborted=aborted)


END = EndValue(10, 3, 0, 1, 77)


def test_a_cycle_value_round_trips() -> None:
    e = entry(10, 19)
    assert parse_cycle(key(e)) == (False, [e])
    assert parse_cycle(key(e, aborted=True)) == (True, [e])


def test_the_chain_continues_the_end_in_offset_order_across_keys() -> None:
    values = [key(entry(20, 24), entry(0, 4, partition=1)), key(entry(10, 19)), key(entry(25, 30))]
    assert [(s.base, s.last) for s in chain_of(values, END, "t", 0, TID.hex)] == [
        (10, 19),
        (20, 24),
        (25, 30),
    ]


def test_the_chain_skips_what_is_folded_stale_aborted_or_another_incarnations() -> None:
    values = [
        key(entry(0, 9)),  # folded already: below the end
        key(entry(10, 19, epoch=2)),  # an earlier epoch's, never acknowledged past the end
        key(entry(10, 19, tid=uuid.uuid4().hex)),  # a deleted topic of the same name
        key(entry(10, 14), aborted=True),  # a tombstone
    ]
    assert chain_of(values, END, "t", 0, TID.hex) == []


def test_the_chain_stops_at_a_gap() -> None:
    values = [key(entry(10, 19)), key(entry(25, 30))]
    assert [s.base for s in chain_of(values, END, "t", 0, TID.hex)] == [10]


def test_two_entries_at_one_offset_refuse_the_chain() -> None:
    with pytest.raises(ChainError):
        chain_of([key(entry(10, 19)), key(entry(10, 12))], END, "t", 0, TID.hex)


def kv(k: str, value: bytes) -> KeyValue:
    return KeyValue(k, value, 1, 1, 1)


def topic_kv(tid: uuid.UUID = TID) -> KeyValue:
    return kv("/topics/t", TopicInfo("t", tid, 1, {}).to_json())


def end_kv(next_offset: int, epoch: int) -> KeyValue:
    return kv("/logs/t/0/end", EndValue(next_offset, epoch).encode())


@pytest.mark.parametrize(
    ("topic", "end", "settled"),
    [
        (None, None, True),  # the topic is gone
        (topic_kv(uuid.uuid4()), end_kv(0, 3), True),  # re-created: another incarnation
        (topic_kv(), None, False),  # keys half deleted or not written: look again
        (topic_kv(), end_kv(10, 3), False),  # the chain starts at it: still needed
        (topic_kv(), end_kv(11, 3), True),  # folded past its base
        (topic_kv(), end_kv(10, 4), True),  # a newer epoch folded the chain at its take
    ],
)
def test_when_an_entry_is_settled(
    topic: KeyValue | None, end: KeyValue | None, settled: bool
) -> None:
    assert entry_settled(entry(10, 19), topic, end) is settled
