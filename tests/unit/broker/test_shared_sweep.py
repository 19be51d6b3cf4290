"""When a segment of a shared object is dead (broker/shared_sweep.py): unnamed, and no
commit can name it any more. Every branch, on keys as the metadata store returns them."""

from __future__ import annotations

import uuid
from types import MappingProxyType

import pytest

from broker.meta.base import KeyValue
from broker.meta.schema import SegmentMeta, TopicInfo, end_json, seg_entry_key
from broker.shared_sweep import segment_dead
from segments.shared import SharedRange

TOPIC_ID = uuid.UUID(int=7)
R = SharedRange("orders", TOPIC_ID.hex, 2, 5, 100, 4096, 300, "1-ab-000000000009.kfm")


def kv(key: str, value: bytes) -> KeyValue:
    return KeyValue(key, value, 1, 1, 1)


def topic(topic_id: uuid.UUID = TOPIC_ID) -> KeyValue:
    info = TopicInfo("orders", topic_id, 4, MappingProxyType({}))
    return kv("/topics/orders", info.to_json())


def end(next_offset: int, epoch: int) -> KeyValue:
    return kv("/logs/orders/2/end", end_json(next_offset, epoch, 0))


def entry(base: int, key: str) -> KeyValue:
    seg = SegmentMeta(base, base + 9, 300, 10, -1, "etag", key)
    return kv(seg_entry_key("orders", 2, base), seg.to_json())


def test_a_named_segment_lives_whatever_else_holds() -> None:
    named = [entry(90, "segment-x.kfs"), entry(100, R.entry_name)]
    assert not segment_dead(R, topic(), end(110, 5), named)
    assert not segment_dead(R, topic(), end(110, 9), named)
    assert not segment_dead(R, None, None, named)


def test_unnamed_with_the_end_still_at_its_base_may_still_be_committed() -> None:
    assert not segment_dead(R, topic(), end(100, 5), [entry(90, "segment-x.kfs")])
    assert not segment_dead(R, topic(), end(100, 5), [])


def test_unnamed_with_the_end_past_its_base_or_a_newer_epoch_is_dead() -> None:
    assert segment_dead(R, topic(), end(101, 5), [entry(100, "segment-merged.kfs")])
    assert segment_dead(R, topic(), end(100, 6), [])  # a new owner took the partition
    assert segment_dead(R, topic(), end(40, 6), [])  # ... and cut it back (repair)


def test_unnamed_in_a_deleted_or_recreated_topic_is_dead() -> None:
    assert segment_dead(R, None, None, [])
    assert segment_dead(R, topic(uuid.UUID(int=8)), end(0, 1), [])


def test_no_end_key_yet_keeps_it() -> None:
    assert not segment_dead(R, topic(), None, [])


def test_the_same_range_of_another_object_does_not_name_it() -> None:
    other = R.entry_name.replace("000000000009", "000000000010")
    assert segment_dead(R, topic(), end(110, 5), [entry(100, other)])


def test_a_value_that_does_not_decode_is_an_error_the_sweep_keeps_the_object_for() -> None:
    """``segment_dead`` raises on an entry it cannot read; the sweep keeps the object then
    (``SharedSweeper._all_dead``), it never guesses."""
    with pytest.raises(ValueError):
        segment_dead(R, topic(), end(110, 5), [kv("/logs/orders/2/segments/x", b"{not json")])
