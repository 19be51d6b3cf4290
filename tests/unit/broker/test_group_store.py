"""``group_store.purge_topic_offsets`` over the real embedded metadata store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.group_store import MetaGroupStore, purge_topic_offsets
from broker.meta.base import KeyValue, Put
from broker.meta.embedded import EmbeddedStore
from broker.meta.schema import (
    group_offset_key,
    group_offset_topic,
    group_state_key,
    txn_offset_key,
    txn_offset_topic,
    txn_offsets_prefix,
    txn_state_key,
)
from groupcoord.model import OffsetRecord, TopicPartition


@pytest.fixture
async def meta(tmp_path: Path) -> AsyncIterator[EmbeddedStore]:
    store = EmbeddedStore(str(tmp_path / "meta"))
    yield store
    await store.close()


def _offset(n: int) -> bytes:
    return OffsetRecord(offset=n).to_json()


async def _offsets(store: MetaGroupStore, group: str) -> dict[tuple[str, int], int]:
    got = await store.fetch_offsets(group)
    return {(tp.topic, tp.partition): rec.offset for tp, rec in got.items()}


def test_offset_key_topics() -> None:
    assert group_offset_topic(group_offset_key("a/b", "orders", 3)) == "orders"
    assert group_offset_topic(group_state_key("g")) is None
    assert group_offset_topic("/topics/orders") is None
    assert txn_offset_topic(txn_offset_key("t/x", "a/b", "orders", 3)) == "orders"
    assert txn_offset_topic(txn_state_key("t/x")) is None


async def test_purge_deletes_the_topics_offsets_of_every_group(meta: EmbeddedStore) -> None:
    groups = MetaGroupStore(meta)
    await meta.txn(
        [],
        [
            Put(group_offset_key("g1", "orders", 0), _offset(5)),
            Put(group_offset_key("g1", "orders", 1), _offset(7)),
            Put(group_offset_key("g1", "orders-eu", 0), _offset(3)),  # a name sharing a prefix
            Put(group_offset_key("g/2", "orders", 0), _offset(2)),
            Put(group_state_key("g1"), b"{}"),
            Put(txn_offset_key("tx/1", "g1", "orders", 1), _offset(8)),  # pending, in a txn
            Put(txn_offset_key("tx/1", "g1", "orders-eu", 1), _offset(9)),
        ],
    )
    deleted_at = await meta.put("/topics/unrelated", b"x")  # the deletion's revision

    assert await purge_topic_offsets(meta, "orders", deleted_at) == 4

    assert await _offsets(groups, "g1") == {("orders-eu", 0): 3}
    assert await _offsets(groups, "g/2") == {}
    assert await meta.get(group_state_key("g1")) is not None  # the group itself stays
    pending = [kv.key for kv in await meta.range(txn_offsets_prefix("tx/1"))]
    assert pending == [txn_offset_key("tx/1", "g1", "orders-eu", 1)]


async def test_offsets_committed_after_the_deletion_stay(meta: EmbeddedStore) -> None:
    """A topic re-created under the name, and committed to, keeps its new offsets even when
    the purge of the old incarnation runs late."""
    groups = MetaGroupStore(meta)
    await meta.txn(
        [],
        [
            Put(group_offset_key("g", "orders", 0), _offset(50)),
            Put(group_offset_key("g", "orders", 1), _offset(60)),
        ],
    )
    deleted_at = await meta.put("/topics/marker", b"x")
    await groups.commit_offsets("g", [(TopicPartition("orders", 1), OffsetRecord(offset=4))])

    assert await purge_topic_offsets(meta, "orders", deleted_at) == 1

    assert await _offsets(groups, "g") == {("orders", 1): 4}


async def test_a_key_rewritten_between_read_and_delete_stays(
    meta: EmbeddedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks are guarded by each key's revision as read: a commit landing between the
    purge's read and its delete fails the chunk, and the keys are then deleted one by one,
    all but the rewritten one."""
    groups = MetaGroupStore(meta)
    await meta.txn([], [Put(group_offset_key("g", "t", p), _offset(p)) for p in range(3)])
    deleted_at = await meta.put("/topics/marker", b"x")

    real_range = meta.range

    async def range_then_commit(prefix: str) -> list[KeyValue]:
        kvs = await real_range(prefix)
        await groups.commit_offsets("g", [(TopicPartition("t", 1), OffsetRecord(offset=99))])
        return kvs

    monkeypatch.setattr(meta, "range", range_then_commit)
    assert await purge_topic_offsets(meta, "t", deleted_at) == 2

    assert await _offsets(groups, "g") == {("t", 1): 99}
