"""Metadata transactions whose outcome is unknown (broker/commit.py), deterministically.

An in-process broker over the real embedded metadata store and a local-directory store,
and over a real etcd and SeaweedFS (S3). The metadata store is wrapped so that one chosen
transaction is applied and then reported as failed (a deadline exceeded after the store
committed it), or reported as failed without being applied, or so that the store stays
unreachable for a while. The broker must acknowledge exactly the records that were
committed, delete nothing that is referenced, and serve every acknowledged record
afterwards.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from broker.config import BrokerConfig
from broker.meta.base import Compare, MetaStore, MetaStoreError, Op, Put, TxnResult, open_meta
from broker.meta.schema import owner_key, seg_entry_key
from broker.partition import AppendError, AppendResult, PartitionLog
from broker.server import Broker
from protocol.batch import iter_batches, read_header
from protocol.errors import ErrorCode
from protocol.records import RecordInput, build_batch, decode_batch
from segments.format import partition_prefix
from tests.fixtures.inprocess import local_config
from tests.fixtures.s3 import create_bucket

TOPIC = "amb"

Match = Callable[[Sequence[Compare], Sequence[Op]], bool]


class FlakyMeta:
    """The real metadata store; the next transaction that ``match`` picks is applied (or
    not) and then fails with MetaStoreError, as etcd's client does on a deadline."""

    def __init__(self, inner: MetaStore) -> None:
        self.inner = inner
        self.max_txn_ops = inner.max_txn_ops
        self.match: Match | None = None
        self.apply = True
        self.down = 0  # further transactions that fail, unapplied, after the match
        self.hits = 0
        self.fired = asyncio.Event()  # set when the armed transaction is reported failed

    def arm(self, match: Match, *, apply: bool, down: int = 0) -> None:
        self.match, self.apply, self.down = match, apply, down

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        if self.match is not None and self.match(compares, success):
            self.match = None
            self.hits += 1
            if self.apply:
                await self.inner.txn(compares, success, failure)
            self.fired.set()
            raise MetaStoreError("etcd DEADLINE_EXCEEDED: injected after the call")
        if self.down > 0:
            self.down -= 1
            raise MetaStoreError("etcd unavailable: injected")
        return await self.inner.txn(compares, success, failure)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def puts_under(fragment: str) -> Match:
    def match(_compares: Sequence[Compare], ops: Sequence[Op]) -> bool:
        return any(isinstance(op, Put) and fragment in op.key for op in ops)

    return match


def config(tmp: Path, **kw: Any) -> BrokerConfig:
    defaults: dict[str, Any] = {
        "merge_interval_ms": 3_600_000,
        "retention_check_interval_ms": 3_600_000,
        "merge_min_age_ms": 0,
        "merge_min_segments": 2,
        "segment_delete_grace_ms": 0,
    }
    return local_config(tmp, **{**defaults, **kw})


pytestmark = pytest.mark.integration


@pytest.fixture(params=["local", "s3-etcd"])
async def node(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Broker, FlakyMeta]]:
    cfg = config(tmp_path)
    if request.param == "s3-etcd":
        endpoint = request.getfixturevalue("seaweedfs_s3")
        bucket = await asyncio.to_thread(create_bucket, endpoint)
        cfg = config(
            tmp_path,
            store_url=endpoint.store_url(bucket, "kafscale"),
            meta_url=request.getfixturevalue("etcd_url"),
            meta_prefix=f"/amb-{uuid.uuid4().hex[:8]}",
        )
    meta = FlakyMeta(open_meta(cfg.meta_url, cfg.data_dir, cfg.meta_prefix))
    b = Broker(cfg, meta=meta)
    await b.start()
    await b.topics.create(TOPIC, 1)
    b.logs.committer.resolve_s = 0.5
    try:
        yield b, meta
    finally:
        meta.match, meta.down = None, 0
        await b.stop()


def append(b: Broker, lg: PartitionLog, tag: str) -> AppendResult:
    recs: list[RecordInput] = [(tag.encode(), f"{tag}-{j}".encode(), []) for j in range(2)]
    view = memoryview(bytearray(build_batch(recs)))
    res = lg.append(read_header(view), view)
    assert res.error == ErrorCode.NONE and res.done is not None
    b.logs.appended(lg, len(view))
    return res


async def outcome(res: AppendResult) -> ErrorCode:
    """How an append ended: NONE once committed, else the error its producer hears."""
    assert res.done is not None
    try:
        await res.done
    except AppendError as exc:
        return exc.code
    return ErrorCode.NONE


async def commit(b: Broker, lg: PartitionLog, tag: str) -> ErrorCode:
    return await outcome(append(b, lg, tag))


async def values(b: Broker, lg: PartitionLog) -> list[bytes]:
    out: list[bytes] = []
    offset = lg.log_start
    while offset < lg.hw:
        views = await b.logs.read(lg, offset, 1 << 20)
        assert views, f"nothing read at {offset} below the high watermark {lg.hw}"
        for view in views:
            for _hdr, bv in iter_batches(view):
                for r in decode_batch(bv)[1]:
                    if r.offset >= offset and r.value is not None:
                        out.append(r.value)
                        offset = r.offset + 1
    return out


async def objects(b: Broker) -> set[str]:
    """Names of the partition's objects in the store."""
    prefix = partition_prefix("default", TOPIC, 0)
    return {info.key[len(prefix) :] for info in await b.store.list(prefix)}


async def end_of(b: Broker) -> dict[str, int]:
    kv = await b.meta.get(f"/logs/{TOPIC}/0/end")
    assert kv is not None
    return dict(json.loads(kv.value))


async def test_applied_commit_reported_failed_is_acknowledged(
    node: tuple[Broker, FlakyMeta],
) -> None:
    b, meta = node
    lg = await b.logs.get(TOPIC, 0)
    assert await commit(b, lg, "a") == ErrorCode.NONE
    meta.arm(puts_under("/segments/"), apply=True)
    assert await commit(b, lg, "b") == ErrorCode.NONE  # committed: acknowledged
    assert meta.hits == 1 and lg.hw == 4 and (await end_of(b))["next_offset"] == 4
    assert b.logs.logs.get((TOPIC, 0)) is lg  # still the owner, at the right revision
    assert await commit(b, lg, "c") == ErrorCode.NONE
    assert await values(b, lg) == [b"a-0", b"a-1", b"b-0", b"b-1", b"c-0", b"c-1"]
    assert {s.key for s in lg.segments} <= await objects(b)
    b.logs.cache.clear()
    assert await values(b, lg) == [b"a-0", b"a-1", b"b-0", b"b-1", b"c-0", b"c-1"]


async def test_unapplied_commit_reported_failed_is_retriable_and_cleans_up(
    node: tuple[Broker, FlakyMeta],
) -> None:
    b, meta = node
    lg = await b.logs.get(TOPIC, 0)
    assert await commit(b, lg, "a") == ErrorCode.NONE
    before = await objects(b)
    meta.arm(puts_under("/segments/"), apply=False)
    assert await commit(b, lg, "b") == ErrorCode.KAFKA_STORAGE_ERROR  # retriable
    assert lg.hw == 2 and lg.next_offset == 2 and (await end_of(b))["next_offset"] == 2
    await b.logs.flusher.idle()  # the producer hears of the failure before the clean-up
    assert await objects(b) == before  # its objects were never committed: removed
    assert await commit(b, lg, "b") == ErrorCode.NONE  # the producer's retry
    assert await values(b, lg) == [b"a-0", b"a-1", b"b-0", b"b-1"]


async def test_unknown_outcome_fails_retriably_deletes_nothing_and_heals(
    node: tuple[Broker, FlakyMeta],
) -> None:
    b, meta = node
    lg = await b.logs.get(TOPIC, 0)
    assert await commit(b, lg, "a") == ErrorCode.NONE
    # applied, and then the store stays out of reach longer than the resolution lasts
    meta.arm(puts_under("/segments/"), apply=True, down=1_000_000)
    assert await commit(b, lg, "b") == ErrorCode.KAFKA_STORAGE_ERROR
    assert lg.state == "closed" and b.logs.logs.get((TOPIC, 0)) is None
    names = await objects(b)
    assert len([n for n in names if n.endswith(".kfs")]) == 2  # nothing deleted
    meta.down = 0  # the store is back: the next request takes the partition afresh
    lg2 = await b.logs.get(TOPIC, 0)
    assert lg2.epoch == lg.epoch + 1 and lg2.hw == 4  # "b" had been committed after all
    assert await values(b, lg2) == [b"a-0", b"a-1", b"b-0", b"b-1"]
    assert await commit(b, lg2, "c") == ErrorCode.NONE
    assert await values(b, lg2) == [b"a-0", b"a-1", b"b-0", b"b-1", b"c-0", b"c-1"]


async def test_merge_with_an_unknown_outcome_loses_nothing(
    node: tuple[Broker, FlakyMeta],
) -> None:
    b, meta = node
    lg = await b.logs.get(TOPIC, 0)
    for tag in "abcd":
        assert await commit(b, lg, tag) == ErrorCode.NONE
    maint = b.logs.maintenance
    assert maint is not None
    expected = [f"{t}-{j}".encode() for t in "abcd" for j in range(2)]
    # applied, reported failed: the merge counts, and nothing it references goes
    meta.arm(puts_under("/segments/"), apply=True)
    assert await maint.merge_partition(lg) == 1
    assert [(s.base, s.last) for s in lg.segments] == [(0, 7)]
    await maint.flush_deletes()
    assert {lg.segments[0].key} == await objects(b)  # one object: its index inside
    b.logs.cache.clear()
    assert await values(b, lg) == expected
    # not applied, reported failed: the merged object goes, the run stays
    for tag in "efgh":
        assert await commit(b, lg, tag) == ErrorCode.NONE
    before = await objects(b)
    meta.arm(puts_under("/segments/"), apply=False)
    assert await maint.merge_partition(lg) == 0
    assert len(lg.segments) == 5 and await objects(b) == before
    b.logs.cache.clear()
    assert await values(b, lg) == expected + [f"{t}-{j}".encode() for t in "efgh" for j in range(2)]


async def test_log_start_commit_applied_but_reported_failed(
    node: tuple[Broker, FlakyMeta],
) -> None:
    b, meta = node
    lg = await b.logs.get(TOPIC, 0)
    for tag in "abc":
        assert await commit(b, lg, tag) == ErrorCode.NONE
    maint = b.logs.maintenance
    assert maint is not None
    meta.arm(puts_under("/end"), apply=True)
    assert await maint.delete_records(lg, 4) == 4
    assert lg.log_start == 4 and (await end_of(b))["log_start"] == 4
    assert await commit(b, lg, "d") == ErrorCode.NONE  # the end revision is right
    assert await values(b, lg) == [b"c-0", b"c-1", b"d-0", b"d-1"]


WIDE = 150  # partitions in one flush cycle: three commit chunks of at most 64


async def wide_topic(b: Broker) -> list[PartitionLog]:
    """``WIDE`` partitions, owned. Appending one batch to each before the flusher runs
    makes a single cycle take them all (committed in three chunks, together)."""
    await b.topics.create("wide", WIDE)
    return [await b.logs.get("wide", p) for p in range(WIDE)]


async def test_a_wide_cycle_with_one_ambiguous_chunk_acknowledges_all(
    node: tuple[Broker, FlakyMeta],
) -> None:
    """The chunks of a cycle are sent together: the one applied and reported failed is
    resolved as committed while the others commit; every record is acknowledged once."""
    b, meta = node
    lgs = await wide_topic(b)
    txns = b.logs.flusher.stats["txns"]
    meta.arm(puts_under("/segments/"), apply=True)
    results = [append(b, lg, f"w{lg.partition}") for lg in lgs]
    assert [await outcome(r) for r in results] == [ErrorCode.NONE] * WIDE
    stats = b.logs.committer.stats
    assert meta.hits == 1 and stats["ambiguous"] == 1 and stats["unresolved"] == 0
    assert b.logs.flusher.stats["txns"] - txns == 3  # one cycle, three chunks
    b.logs.cache.clear()
    for lg in lgs:
        assert b.logs.logs.get(("wide", lg.partition)) is lg and lg.hw == 2
        assert await values(b, lg) == [f"w{lg.partition}-{j}".encode() for j in range(2)]


async def test_a_wide_cycle_with_one_fenced_partition_fails_only_it(
    node: tuple[Broker, FlakyMeta],
) -> None:
    """Another owner took one partition: its chunk's guard fails and is retried per
    partition, while the other chunks commit; only that partition's producer hears
    NOT_LEADER_OR_FOLLOWER, and nothing of the others is lost."""
    b, _meta = node
    lgs = await wide_topic(b)
    taken = lgs[100]
    await b.meta.put(owner_key("wide", 100), b'{"broker":99,"epoch":99,"topic_id":"x"}')
    results = [append(b, lg, f"w{lg.partition}") for lg in lgs]
    codes = [await outcome(r) for r in results]
    assert codes[100] == ErrorCode.NOT_LEADER_OR_FOLLOWER and taken.state == "closed"
    assert codes[:100] + codes[101:] == [ErrorCode.NONE] * (WIDE - 1)
    b.logs.cache.clear()
    for lg in lgs[:100] + lgs[101:]:
        assert lg.hw == 2
        assert await values(b, lg) == [f"w{lg.partition}-{j}".encode() for j in range(2)]


async def test_applied_commit_whose_probe_a_new_owner_merged_away(
    node: tuple[Broker, FlakyMeta],
) -> None:
    """A cycle of two partitions is applied and reported failed, and before the store
    answers again another broker takes one of them and merges its entry away. The other
    partition's entry still proves the (atomic) transaction applied: both partitions'
    records are acknowledged (they were committed before the takeover), the taken one is
    dropped, and the other stays owned at the commit's revision."""
    b, meta = node
    b.logs.committer.resolve_s = 120.0  # the store stays out of reach until the test is done
    await b.topics.create("pair", 2)
    x, y = [await b.logs.get("pair", p) for p in range(2)]
    meta.arm(puts_under("/segments/"), apply=True, down=1_000_000)
    rx, ry = append(b, x, "x"), append(b, y, "y")
    await asyncio.wait_for(meta.fired.wait(), 60)
    # what the new owner of pair-0 does meanwhile: takes it, merges its entry away
    inner = meta.inner
    await inner.put(owner_key("pair", 0), b'{"broker":99,"epoch":99,"topic_id":"x"}')
    await inner.delete(seg_entry_key("pair", 0, 0))
    meta.down = 0
    assert await outcome(ry) == ErrorCode.NONE
    assert await outcome(rx) == ErrorCode.NONE
    assert b.logs.logs.get(("pair", 1)) is y and y.hw == 2 and x.state == "closed"
    assert await commit(b, y, "z") == ErrorCode.NONE  # its end revision is the commit's
    b.logs.cache.clear()
    assert await values(b, y) == [b"y-0", b"y-1", b"z-0", b"z-1"]
