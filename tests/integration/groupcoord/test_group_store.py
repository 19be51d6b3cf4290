"""MetaGroupStore against both real metadata stores: embedded and a real etcd process."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.group_store import MetaGroupStore
from broker.meta.base import MetaStore
from broker.meta.embedded import EmbeddedStore
from broker.meta.etcd import EtcdStore
from groupcoord import (
    GroupConflictError,
    GroupCoordinator,
    GroupRecord,
    MemberRecord,
    OffsetCommit,
    OffsetRecord,
    TopicPartition,
)
from tests.unit.groupcoord.conftest import FAST
from tests.unit.groupcoord.test_membership import form_stable

pytestmark = pytest.mark.integration


@pytest.fixture(params=["embedded", "etcd"])
async def meta(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MetaStore]:
    store: MetaStore
    if request.param == "embedded":
        store = EmbeddedStore(str(tmp_path / "meta"))
    else:
        url = request.getfixturevalue("etcd_url")
        store = EtcdStore.from_url(url, prefix=f"/t-{uuid.uuid4().hex}")
    yield store
    await store.close()


RECORD = GroupRecord(
    "consumer",
    "range",
    3,
    "m1",
    (MemberRecord("m1", "i1", "cid", "/127.0.0.1", 6000, 30000, b"\x00meta", b"\x01asg"),),
    123,
)


async def test_state_round_trip_and_compare_and_set(meta: MetaStore) -> None:
    store = MetaGroupStore(meta)
    assert await store.load_group("g") is None
    rev = await store.save_group("g", RECORD, 0)
    loaded = await store.load_group("g")
    assert loaded is not None and loaded.record == RECORD and loaded.revision == rev
    with pytest.raises(GroupConflictError):
        await store.save_group("g", RECORD, 0)  # must not exist any more
    rev2 = await store.save_group("g", RECORD, rev)
    assert rev2 > rev
    with pytest.raises(GroupConflictError):
        await store.save_group("g", RECORD, rev)  # stale revision
    with pytest.raises(GroupConflictError):
        await store.delete_group("g", rev)
    await store.delete_group("g", rev2)
    assert await store.load_group("g") is None


async def test_offsets_chunked_listed_and_deleted(meta: MetaStore) -> None:
    store = MetaGroupStore(meta)
    n = meta.max_txn_ops * 2 + 5  # more than one transaction can hold
    rows = [(TopicPartition("t", p), OffsetRecord(p * 10, 1, f"m{p}", 99)) for p in range(n)]
    rows.append((TopicPartition("t", 0), OffsetRecord(7, -1, None, 100)))  # last one wins
    await store.commit_offsets("a/b", rows)  # a '/' in a group id stays one group
    await store.commit_offsets("c", [(TopicPartition("u.v-w", 2), OffsetRecord(1))])
    got = await store.fetch_offsets("a/b")
    assert len(got) == n
    assert got[TopicPartition("t", 0)] == OffsetRecord(7, -1, None, 100)
    assert got[TopicPartition("t", n - 1)].metadata == f"m{n - 1}"
    assert await store.list_groups() == ["a/b", "c"]
    assert await store.fetch_offsets("a") == {}
    await store.delete_offsets("a/b", [TopicPartition("t", p) for p in range(1, n)])
    assert set(await store.fetch_offsets("a/b")) == {TopicPartition("t", 0)}
    await store.delete_group("a/b", 0)  # offsets only: no state key (revision 0)
    assert await store.list_groups() == ["c"]


async def test_coordinator_resumes_from_store_after_restart(meta: MetaStore) -> None:
    store = MetaGroupStore(meta)
    c1 = GroupCoordinator(store, FAST)
    ids = await form_stable(c1, 2)
    tps = [TopicPartition("t", p) for p in range(3)]
    await c1.commit_offsets(
        "g", 1, ids[0], None, [OffsetCommit(tp, 40 + tp.partition) for tp in tps]
    )
    await c1.stop()
    c2 = GroupCoordinator(MetaGroupStore(meta), FAST)
    try:
        _, offsets = await c2.fetch_offsets("g")
        assert {tp.partition: r.offset for tp, r in offsets.items()} == {0: 40, 1: 41, 2: 42}
        desc = await c2.describe_group("g")
        assert desc.state == "Stable" and len(desc.members) == 2
        # members of the loaded generation go on committing
        ok = await c2.commit_offsets("g", 1, ids[1], None, [OffsetCommit(tps[0], 50)])
        assert set(ok.values()) == {0}
    finally:
        await c2.stop()


async def test_concurrent_commits_share_transactions(meta: MetaStore) -> None:
    store = MetaGroupStore(meta)
    before = await meta.put("/probe", b"")
    await asyncio.gather(
        *(
            store.commit_offsets(
                f"g{i}", [(TopicPartition("t", p), OffsetRecord(i)) for p in range(3)]
            )
            for i in range(20)
        )
    )
    after = await meta.put("/probe", b"")
    assert after - before - 1 < 20  # fewer transactions than requests (each bumps the revision)
    for i in range(20):
        got = await store.fetch_offsets(f"g{i}")
        assert {tp.partition: r.offset for tp, r in got.items()} == {0: i, 1: i, 2: i}


async def test_a_failed_group_commit_fails_every_request_in_it(tmp_path: Path) -> None:
    meta = EmbeddedStore(str(tmp_path / "meta"))
    store = MetaGroupStore(meta)
    await meta.close()  # every write now fails
    results = await asyncio.gather(
        *(
            store.commit_offsets(f"g{i}", [(TopicPartition("t", 0), OffsetRecord(1))])
            for i in range(3)
        ),
        return_exceptions=True,
    )
    assert all(isinstance(r, Exception) for r in results)
