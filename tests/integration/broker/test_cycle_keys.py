"""Cycle keys (broker/fold.py): a flush cycle committed as one metadata key and folded
into the partitions' own keys later, deterministically and with faults.

An in-process broker with ``cycle_keys_min_partitions=1`` (every cycle commits as a
cycle key) over the embedded metadata store and a local directory, and over a real etcd
and SeaweedFS. Its background fold is stopped: each test folds when it means to, so an
acknowledged segment is named only by its cycle key for as long as the test needs. The
store is wrapped (``FlakyMeta``) so that one chosen transaction is applied or not and
then reported failed. Every acknowledged record must read back, from this broker and
from the next one to take the partition.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from broker.config import BrokerConfig
from broker.meta.base import Compare, MetaStoreError, Put, open_meta
from broker.meta.schema import CYCLES_PREFIX, broker_key, parse_cycle, segments_prefix
from broker.partition import PartitionLog
from broker.repair import RepairError, Target, truncate
from broker.server import Broker
from ingest_job.manifest import read_logs
from ingest_job.model import IngestError
from protocol.errors import ErrorCode, KafkaProtocolError
from segments.store import open_store
from tests.fixtures.s3 import create_bucket
from tests.integration.broker.test_ambiguous_commits import (
    FlakyMeta,
    append,
    commit,
    config,
    outcome,
    puts_under,
    values,
)

pytestmark = pytest.mark.integration

TOPIC = "cyc"


async def start(cfg: BrokerConfig) -> tuple[Broker, FlakyMeta]:
    meta = FlakyMeta(open_meta(cfg.meta_url, cfg.data_dir, cfg.meta_prefix))
    b = Broker(cfg, meta=meta)
    await b.start()
    await b.logs.folder.stop()  # the tests fold explicitly
    b.logs.committer.resolve_s = 0.5
    return b, meta


async def crash_stop(b: Broker) -> None:
    """Stop ``b`` without folding: its acknowledged segments stay in its cycle keys, as
    after a crash (its partitions are released, so the next broker takes them at once)."""

    async def no_fold() -> None:
        return None

    b.logs.folder.fold_all = no_fold  # type: ignore[method-assign]
    await b.stop()


@pytest.fixture(params=["local", "s3-etcd"])
async def cfg(request: pytest.FixtureRequest, tmp_path: Path) -> BrokerConfig:
    kw: dict[str, Any] = {"cycle_keys_min_partitions": 1}
    if request.param == "s3-etcd":
        endpoint = request.getfixturevalue("seaweedfs_s3")
        bucket = await asyncio.to_thread(create_bucket, endpoint)
        kw |= {
            "store_url": endpoint.store_url(bucket, "kafscale"),
            "meta_url": request.getfixturevalue("etcd_url"),
            "meta_prefix": f"/cyc-{uuid.uuid4().hex[:8]}",
        }
    return config(tmp_path, **kw)


@pytest.fixture
async def node(cfg: BrokerConfig) -> AsyncIterator[tuple[Broker, FlakyMeta]]:
    b, meta = await start(cfg)
    await b.topics.create(TOPIC, 1)
    try:
        yield b, meta
    finally:
        meta.match, meta.down = None, 0
        await b.stop()


async def cycle_keys(b: Broker) -> dict[str, tuple[bool, int]]:
    """Every cycle key: (aborted, entries)."""
    out = {}
    for kv in await b.meta.range(CYCLES_PREFIX):
        aborted, entries = parse_cycle(kv.value)
        out[kv.key] = (aborted, len(entries))
    return out


async def cycle_keys_raw(b: Broker) -> list[str]:
    """Every cycle key, decodable or not."""
    return [kv.key for kv in await b.meta.range(CYCLES_PREFIX)]


async def own_entries(b: Broker, topic: str, partition: int) -> list[int]:
    """Base offsets of the partition's own manifest entries."""
    return [
        int(kv.key.rsplit("/", 1)[1])
        for kv in await b.meta.range(segments_prefix(topic, partition))
    ]


async def own_end(b: Broker, topic: str, partition: int) -> dict[str, int]:
    kv = await b.meta.get(f"/logs/{topic}/{partition}/end")
    assert kv is not None
    return dict(json.loads(kv.value))


def tags(*names: str) -> list[bytes]:
    return [f"{t}-{j}".encode() for t in names for j in range(2)]


async def committed(b: Broker, names: str) -> PartitionLog:
    """Partition 0 of TOPIC with one acknowledged cycle per name in ``names``."""
    lg = await b.logs.get(TOPIC, 0)
    for tag in names:
        assert await commit(b, lg, tag) == ErrorCode.NONE
    return lg


async def test_a_wide_cycle_is_one_transaction_and_its_fold_names_everything(
    node: tuple[Broker, FlakyMeta], cfg: BrokerConfig
) -> None:
    b, _meta = node
    await b.topics.create("wide", 150)
    lgs = [await b.logs.get("wide", p) for p in range(150)]
    txns = b.logs.flusher.stats["txns"]
    results = [append(b, lg, f"w{lg.partition}") for lg in lgs]
    assert [await outcome(r) for r in results] == [ErrorCode.NONE] * 150
    assert b.logs.flusher.stats["txns"] - txns == 1  # one cycle: one transaction, not three
    keys = await cycle_keys(b)
    assert list(keys.values()) == [(False, 150)]
    assert (
        await own_entries(b, "wide", 7) == [] and (await own_end(b, "wide", 7))["next_offset"] == 0
    )
    b.logs.cache.clear()
    assert await values(b, lgs[7]) == tags("w7")  # served while named by the cycle key alone
    await b.logs.folder.fold_all()
    assert b.logs.folder.stats["fold_txns"] == 3  # 64 partitions per transaction
    assert await cycle_keys(b) == {}  # every entry folded: the key is gone
    for lg in lgs:
        assert lg.unfolded == [] and lg.folded == 2
        assert await own_entries(b, "wide", lg.partition) == [0]
        end = await own_end(b, "wide", lg.partition)
        assert end["next_offset"] == 2 and end["broker"] == cfg.node_id
    assert await commit(b, lgs[3], "again") == ErrorCode.NONE  # the end revision is right


async def crash_with_keys(cfg: BrokerConfig, tags: str) -> int:
    """A broker that commits ``tags`` to partition 0 and "x" to partition 1, every one
    as a cycle key, then crashes before any fold: its registration."""
    b, _meta = await start(cfg)
    await b.topics.create(TOPIC, 2)
    lgs = [await b.logs.get(TOPIC, p) for p in range(2)]
    for tag in tags:
        assert await commit(b, lgs[0], tag) == ErrorCode.NONE
    assert await commit(b, lgs[1], "x") == ErrorCode.NONE
    assert len(await cycle_keys(b)) == len(tags) + 1 and await own_entries(b, TOPIC, 0) == []
    reg = b.cluster.reg
    await crash_stop(b)
    return reg


async def test_the_next_owner_folds_what_a_crashed_one_left(cfg: BrokerConfig) -> None:
    reg = await crash_with_keys(cfg, "abc")
    b2, _m2 = await start(cfg)
    try:
        assert b2.cluster.reg != reg  # a new registration: its cycle keys are elsewhere
        lg = await b2.logs.get(TOPIC, 0)
        assert lg.hw == 6 and await values(b2, lg) == tags("a", "b", "c")
        assert await own_entries(b2, TOPIC, 0) == [0, 2, 4]  # folded by the take itself
        end = await own_end(b2, TOPIC, 0)
        assert end["next_offset"] == 6 and end["epoch"] == 2 and end["reg"] == b2.cluster.reg
        assert await commit(b2, lg, "d") == ErrorCode.NONE
        lg1 = await b2.logs.get(TOPIC, 1)
        assert await values(b2, lg1) == tags("x")
        assert b2.logs.chains.reads == 1  # the gone registration's keys, read once
        # the earlier registration's keys are all settled now: deleted as leftovers
        folder = b2.logs.folder
        await folder._check_own_keys()
        await folder._check_leftovers(sorted(folder.leftovers))
        assert [k for k in await cycle_keys(b2) if f"/{reg:020d}/" in k] == []
        b2.logs.cache.clear()
        assert await values(b2, lg) == tags("a", "b", "c", "d")
    finally:
        await b2.stop()


async def test_a_take_of_a_long_chain_folds_it_in_steps(cfg: BrokerConfig) -> None:
    """More unfolded segments than one transaction can put: folded under the old epoch
    first, then taken."""
    b, _meta = await start(cfg)
    await b.topics.create(TOPIC, 1)
    lg = await b.logs.get(TOPIC, 0)
    n = 140
    for i in range(n):
        assert await commit(b, lg, f"s{i}") == ErrorCode.NONE
    await crash_stop(b)
    b2, _m2 = await start(cfg)
    try:
        lg2 = await b2.logs.get(TOPIC, 0)
        assert lg2.hw == 2 * n and lg2.epoch == 2
        assert len(await own_entries(b2, TOPIC, 0)) == n
        b2.logs.cache.clear()
        assert await values(b2, lg2) == tags(*(f"s{i}" for i in range(n)))
    finally:
        await b2.stop()


async def test_a_dropped_log_is_taken_again_with_its_cycle_entries(
    node: tuple[Broker, FlakyMeta],
) -> None:
    b, _meta = node
    lg = await committed(b, "ab")
    b.logs.drop(lg, "a test")
    lg2 = await b.logs.get(TOPIC, 0)
    assert lg2 is not lg and lg2.hw == 4 and lg2.epoch == lg.epoch + 1
    assert await own_entries(b, TOPIC, 0) == [0, 2]
    folder = b.logs.folder
    folder._collect_dropped()  # the keys waited only on the dropped log
    assert len(folder.leftovers) == 2 and folder.keys == {}
    await folder._check_leftovers(sorted(folder.leftovers))
    assert await cycle_keys(b) == {} and folder.leftovers == set()
    assert await values(b, lg2) == tags("a", "b")


async def test_applied_cycle_commit_reported_failed_is_acknowledged(
    node: tuple[Broker, FlakyMeta],
) -> None:
    b, meta = node
    lg = await b.logs.get(TOPIC, 0)
    meta.arm(puts_under(CYCLES_PREFIX), apply=True)
    assert await commit(b, lg, "a") == ErrorCode.NONE
    assert meta.hits == 1 and list((await cycle_keys(b)).values()) == [(False, 1)]
    assert await commit(b, lg, "b") == ErrorCode.NONE
    await b.logs.folder.fold_all()
    assert await own_entries(b, TOPIC, 0) == [0, 2] and await cycle_keys(b) == {}
    b.logs.cache.clear()
    assert await values(b, lg) == tags("a", "b")


async def test_unapplied_cycle_commit_is_retriable_and_can_never_apply(
    node: tuple[Broker, FlakyMeta],
) -> None:
    b, meta = node
    lg = await b.logs.get(TOPIC, 0)
    assert await commit(b, lg, "a") == ErrorCode.NONE
    meta.arm(puts_under(CYCLES_PREFIX), apply=False)
    assert await commit(b, lg, "b") == ErrorCode.KAFKA_STORAGE_ERROR  # retriable
    assert lg.hw == 2 and lg.state == "active"
    keys = await cycle_keys(b)
    (tomb,) = [k for k, (aborted, _n) in keys.items() if aborted]
    # the original transaction, arriving late, finds the tombstone: never applied
    late = await meta.inner.txn([Compare(tomb, "create_revision", "==", 0)], [Put(tomb, b"{}")])
    assert not late.succeeded
    assert await commit(b, lg, "b2") == ErrorCode.NONE  # the retry, at the same offsets
    await b.logs.folder.fold_all()
    folder = b.logs.folder
    assert tomb in folder.leftovers
    await folder._check_leftovers(sorted(folder.leftovers))  # its offsets are folded past
    assert await cycle_keys(b) == {}
    b.logs.cache.clear()
    assert await values(b, lg) == tags("a", "b2")


@pytest.mark.parametrize("applied", [True, False])
async def test_unknown_cycle_outcome_drops_the_log_and_the_take_settles_it(
    node: tuple[Broker, FlakyMeta], applied: bool
) -> None:
    b, meta = node
    lg = await b.logs.get(TOPIC, 0)
    assert await commit(b, lg, "a") == ErrorCode.NONE
    meta.arm(puts_under(CYCLES_PREFIX), apply=applied, down=1_000_000)
    assert await commit(b, lg, "b") == ErrorCode.KAFKA_STORAGE_ERROR
    assert lg.state == "closed" and b.logs.logs.get((TOPIC, 0)) is None
    meta.down = 0
    lg2 = await b.logs.get(TOPIC, 0)
    expected = tags("a", "b") if applied else tags("a")
    assert lg2.hw == len(expected) and await values(b, lg2) == expected
    assert await commit(b, lg2, "c") == ErrorCode.NONE
    b.logs.cache.clear()
    assert await values(b, lg2) == [*expected, *tags("c")]
    folder = b.logs.folder
    await folder.fold_all()
    folder._collect_dropped()
    await folder._check_leftovers(sorted(folder.leftovers))
    assert await cycle_keys(b) == {} and folder.leftovers == set()  # nothing left behind


async def test_merges_wait_for_the_fold(node: tuple[Broker, FlakyMeta]) -> None:
    """A merge would need a fold transaction of its own first: it leaves segments that
    only cycle keys name to the next fold."""
    b, _meta = node
    lg = await b.logs.get(TOPIC, 0)
    for tag in "abcd":
        assert await commit(b, lg, tag) == ErrorCode.NONE
    maint = b.logs.maintenance
    assert maint is not None and len(lg.unfolded) == 4
    assert await maint.merge_partition(lg) == 0 and len(lg.unfolded) == 4
    await b.logs.folder.fold_all()
    assert await maint.merge_partition(lg) == 1
    assert [(s.base, s.last) for s in lg.segments] == [(0, 7)]
    assert await own_entries(b, TOPIC, 0) == [0] and await cycle_keys(b) == {}
    await maint.flush_deletes()
    b.logs.cache.clear()
    assert await values(b, lg) == tags(*"abcd")


async def test_delete_records_folds_first(node: tuple[Broker, FlakyMeta]) -> None:
    """Any other guarded transaction of a partition folds it first (the committer's
    hook): its end value is built from the high watermark, which the fold makes the
    store's."""
    b, _meta = node
    lg = await b.logs.get(TOPIC, 0)
    for tag in "abc":
        assert await commit(b, lg, tag) == ErrorCode.NONE
    maint = b.logs.maintenance
    assert maint is not None
    assert await maint.delete_records(lg, 4) == 4
    assert lg.unfolded == [] and await own_entries(b, TOPIC, 0) == [4]
    end = await own_end(b, TOPIC, 0)
    assert end["next_offset"] == 6 and end["log_start"] == 4
    assert await commit(b, lg, "d") == ErrorCode.NONE
    b.logs.cache.clear()
    assert await values(b, lg) == tags("c", "d")


async def test_a_fold_applied_but_reported_failed(node: tuple[Broker, FlakyMeta]) -> None:
    b, meta = node
    lg = await committed(b, "ab")
    meta.arm(puts_under("/segments/"), apply=True)
    await b.logs.folder.fold_all()
    assert meta.hits == 1 and lg.state == "active" and lg.unfolded == [] and lg.folded == 4
    assert await own_entries(b, TOPIC, 0) == [0, 2]
    assert await commit(b, lg, "c") == ErrorCode.NONE  # its end revision is the resolution's
    assert await values(b, lg) == tags("a", "b", "c")


async def test_a_cycle_of_a_gone_registration_is_fenced(node: tuple[Broker, FlakyMeta]) -> None:
    """The registration key is not the one this broker made (its lease expired and the
    key went, or another process took the node id): the cycle commit must fail."""
    b, meta = node
    lg = await b.logs.get(TOPIC, 0)
    assert await commit(b, lg, "a") == ErrorCode.NONE
    key = broker_key(b.config.node_id)
    kv = await meta.inner.get(key)
    assert kv is not None
    await meta.inner.delete(key)
    await meta.inner.put(key, kv.value, b.cluster.lease_id)  # the same lease, a new revision
    assert await commit(b, lg, "b") == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert lg.state == "closed" and [n for _a, n in (await cycle_keys(b)).values()] == [1]


async def test_the_ingest_plan_reads_what_is_not_folded_yet(
    node: tuple[Broker, FlakyMeta],
) -> None:
    b, _meta = node
    lg = await committed(b, "ab")

    async def planned() -> tuple[int, list[tuple[int, int]]]:
        (plog,) = await read_logs(b.meta, [TOPIC])
        return plog.next_offset, [(r.base, r.last) for r in plog.segments]

    assert await own_entries(b, TOPIC, 0) == []
    assert await planned() == (4, [(0, 1), (2, 3)])
    await b.logs.folder.fold_all()
    assert await planned() == (4, [(0, 1), (2, 3)])
    assert await commit(b, lg, "c") == ErrorCode.NONE
    await b.logs.folder.fold_all()
    maint = b.logs.maintenance
    assert maint is not None and await maint.merge_partition(lg) == 1
    assert await planned() == (6, [(0, 5)])


async def test_the_shared_sweep_keeps_what_only_cycle_keys_name(cfg: BrokerConfig) -> None:
    shared = replace(cfg, shared_objects_min_partitions=2)
    b, _meta = await start(shared)
    await b.topics.create(TOPIC, 2)
    lgs = [await b.logs.get(TOPIC, p) for p in range(2)]
    results = [append(b, lg, f"s{lg.partition}") for lg in lgs]
    assert [await outcome(r) for r in results] == [ErrorCode.NONE] * 2
    assert b.logs.flusher.stats["shared_objects"] == 1 and len(await cycle_keys(b)) == 1
    later = time.time() + 3600  # past every grace period
    sweep = b.logs.shared_sweep
    assert await sweep.run_once(now=later) == [] and await sweep.run_once(now=later + 3600) == []
    await crash_stop(b)
    b2, _m2 = await start(shared)
    try:
        for p in range(2):
            lg = await b2.logs.get(TOPIC, p)
            assert await values(b2, lg) == tags(f"s{p}")
        sweep = b2.logs.shared_sweep
        assert await sweep.run_once(now=later) == []
        assert await sweep.run_once(now=later + 3600) == []
        b2.logs.cache.clear()
        for p in range(2):
            assert await values(b2, b2.logs.logs[(TOPIC, p)]) == tags(f"s{p}")
    finally:
        await b2.stop()


async def test_partitions_truncate_refuses_while_cycle_keys_hold_records(
    cfg: BrokerConfig,
) -> None:
    b, _meta = await start(cfg)
    await b.topics.create(TOPIC, 1)
    lg = await b.logs.get(TOPIC, 0)
    for tag in "abc":
        assert await commit(b, lg, tag) == ErrorCode.NONE
    await crash_stop(b)
    with pytest.raises(RepairError, match="3 acknowledged segments past its end 0"):
        await truncate_to(cfg, 2, execute=False)
    b2, _m2 = await start(cfg)  # its take folds them; its graceful stop releases
    assert (await b2.logs.get(TOPIC, 0)).hw == 6
    await b2.stop()
    lines = await truncate_to(cfg, 2, execute=True)
    assert lines[-1] == f"committed: {TOPIC}-0 now ends at 2"


async def truncate_to(cfg: BrokerConfig, offset: int, *, execute: bool) -> list[str]:
    """``kafscale partitions truncate`` of TOPIC-0, as the command runs it."""
    meta = open_meta(cfg.meta_url, cfg.data_dir, cfg.meta_prefix)
    store = open_store(cfg.store_url)
    try:
        return await truncate(meta, store, Target("default", TOPIC, 0), offset, execute=execute)
    finally:
        await store.close()
        await meta.close()


class TwiceFlaky(FlakyMeta):
    """The cycle commit fails unapplied, then the resolution's tombstone is applied and
    reported failed: the retried resolution finds a key, and it is the tombstone."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.plan: list[bool] = []

    async def txn(self, compares: Any, success: Any, failure: Any = ()) -> Any:
        if self.plan and puts_under(CYCLES_PREFIX)(compares, success):
            applied = self.plan.pop(0)
            if applied:
                await self.inner.txn(compares, success, failure)
            raise MetaStoreError("etcd DEADLINE_EXCEEDED: injected")
        return await self.inner.txn(compares, success, failure)


async def test_a_resolution_that_finds_its_own_tombstone_rejects(cfg: BrokerConfig) -> None:
    meta = TwiceFlaky(open_meta(cfg.meta_url, cfg.data_dir, cfg.meta_prefix))
    b = Broker(cfg, meta=meta)
    await b.start()
    try:
        await b.logs.folder.stop()
        b.logs.committer.resolve_s = 5.0
        await b.topics.create(TOPIC, 1)
        lg = await b.logs.get(TOPIC, 0)
        assert await commit(b, lg, "a") == ErrorCode.NONE
        meta.plan = [False, True]  # the commit unapplied; the first tombstone applied
        assert await commit(b, lg, "b") == ErrorCode.KAFKA_STORAGE_ERROR  # never acked
        assert meta.plan == [] and lg.hw == 2
        assert [a for a, _n in (await cycle_keys(b)).values()] == [False, True]
        assert await commit(b, lg, "b2") == ErrorCode.NONE
        b.logs.cache.clear()
        assert await values(b, lg) == tags("a", "b2")
    finally:
        await b.stop()


async def test_a_small_cycle_of_a_log_waiting_for_its_fold_is_a_cycle_key(
    cfg: BrokerConfig,
) -> None:
    """Below --cycle-keys-min-partitions a cycle commits per partition, unless one of its
    logs has entries waiting for a fold (that commit would need the fold first)."""
    b, _meta = await start(replace(cfg, cycle_keys_min_partitions=2))
    try:
        await b.topics.create(TOPIC, 2)
        x, y = [await b.logs.get(TOPIC, p) for p in range(2)]
        folder, flusher = b.logs.folder, b.logs.flusher
        both = [append(b, lg, f"a{lg.partition}") for lg in (x, y)]
        assert [await outcome(r) for r in both] == [ErrorCode.NONE] * 2
        assert folder.stats["cycle_txns"] == 1 and len(x.unfolded) == 1
        assert await commit(b, x, "b") == ErrorCode.NONE  # one partition, waiting: a key
        assert folder.stats["cycle_txns"] == 2 and folder.stats["fold_txns"] == 0
        await folder.fold_all()
        txns = flusher.stats["txns"]
        assert await commit(b, x, "c") == ErrorCode.NONE  # nothing waiting: per partition
        assert folder.stats["cycle_txns"] == 2 and flusher.stats["txns"] == txns + 1
        assert await own_entries(b, TOPIC, 0) == [0, 2, 4]
        assert await values(b, x) == [b"a0-0", b"a0-1", *tags("b", "c")]
    finally:
        await b.stop()


async def test_a_deleted_topics_cycle_entries_settle_and_never_reach_its_successor(
    node: tuple[Broker, FlakyMeta],
) -> None:
    b, _meta = node
    await committed(b, "ab")
    await b.topics.delete(TOPIC)
    await b.topics.create(TOPIC, 1)  # a new incarnation of the name
    lg2 = await b.logs.get(TOPIC, 0)
    assert lg2.hw == 0 and await values(b, lg2) == []
    folder = b.logs.folder
    folder._collect_dropped()
    await folder._check_leftovers(sorted(folder.leftovers))
    assert await cycle_keys(b) == {}  # the old topic id's entries: settled, deleted
    assert await commit(b, lg2, "new") == ErrorCode.NONE
    assert await values(b, lg2) == tags("new")


async def test_a_fold_never_applied_is_tried_again(node: tuple[Broker, FlakyMeta]) -> None:
    """Reported failed and certainly not applied: the log stays, and so do its entries
    in the cycle keys, until the next fold; a transaction that needed the fold first is
    not sent meanwhile."""
    b, meta = node
    lg = await committed(b, "ab")
    meta.arm(puts_under("/segments/"), apply=False)
    await b.logs.folder.fold_all()
    assert meta.hits == 1 and lg.state == "active" and len(lg.unfolded) == 2
    assert await own_entries(b, TOPIC, 0) == [] and len(await cycle_keys(b)) == 2
    await b.logs.folder.fold_all()
    assert lg.unfolded == [] and await own_entries(b, TOPIC, 0) == [0, 2]
    assert await commit(b, lg, "c") == ErrorCode.NONE
    b.logs.cache.clear()
    assert await values(b, lg) == tags("a", "b", "c")


async def test_an_unreadable_cycle_key_refuses_the_take_cleanly(
    cfg: BrokerConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """A cycle key that does not decode (never written by a broker): the take refuses
    with a retriable error and one log line, the ingest plan and the truncate command
    say why, and nothing is served past what the store certainly holds."""
    b, _meta = await start(cfg)
    await b.topics.create(TOPIC, 1)
    lg = await b.logs.get(TOPIC, 0)
    assert await commit(b, lg, "a") == ErrorCode.NONE
    await crash_stop(b)
    b2, meta2 = await start(cfg)
    try:
        (key,) = await cycle_keys(b2)
        await meta2.inner.put(key, b"not a cycle")
        with pytest.raises(KafkaProtocolError) as err:
            await b2.logs.get(TOPIC, 0)
        assert err.value.code == ErrorCode.NOT_LEADER_OR_FOLLOWER
        with pytest.raises(IngestError, match="unfolded entries of cyc-0"):
            await read_logs(b2.meta, [TOPIC])
        folder = b2.logs.folder
        for _ in range(2):  # the owner's periodic check, twice: one error line, key kept
            await folder._check_own_keys()
            await folder._check_leftovers(sorted(folder.leftovers))
        assert list(await cycle_keys_raw(b2)) == [key] and folder.leftovers == set()
        assert len([r for r in caplog.records if "left alone" in r.getMessage()]) == 1
    finally:
        await b2.stop()
    with pytest.raises(RepairError, match="does not decode"):
        await truncate_to(cfg, 0, execute=False)


async def test_a_small_cycle_keeps_the_owner_named_in_the_end(cfg: BrokerConfig) -> None:
    """With a minimum above 1, a small cycle commits per partition; its end value must
    still name the owner, or the cycle keys committed after it would be invisible to
    the next owner's take."""
    small = replace(cfg, cycle_keys_min_partitions=2)
    b, _meta = await start(small)
    stopped = False
    try:
        await b.topics.create(TOPIC, 2)
        x, y = [await b.logs.get(TOPIC, p) for p in range(2)]
        assert await commit(b, x, "a") == ErrorCode.NONE  # one partition: per partition
        assert b.logs.folder.stats["cycle_txns"] == 0
        both = [append(b, lg, f"b{lg.partition}") for lg in (x, y)]  # two: a cycle key
        assert [await outcome(r) for r in both] == [ErrorCode.NONE] * 2
        assert b.logs.folder.stats["cycle_txns"] == 1
        await crash_stop(b)
        stopped = True
    finally:
        if not stopped:
            await b.stop()
    b2, _m2 = await start(small)
    try:
        lg = await b2.logs.get(TOPIC, 0)
        assert await values(b2, lg) == [*tags("a"), b"b0-0", b"b0-1"]
    finally:
        await b2.stop()


async def test_the_controller_deletes_settled_keys_of_a_node_id_gone_for_good(
    cfg: BrokerConfig,
) -> None:
    """A node id that never registers again (a scaled-down pod): its cycle keys are
    deleted by the controller once every entry is settled, and not before; a live
    broker's keys are not its to touch."""
    await crash_with_keys(cfg, "ab")
    gone = f"{CYCLES_PREFIX}{cfg.node_id}/"
    b2, _m2 = await start(replace(cfg, node_id=cfg.node_id + 1))
    try:
        assert b2.logs.folder._controls()  # the only live broker
        folder = b2.logs.folder
        await folder._check_gone_nodes()
        assert len([k for k in await cycle_keys(b2) if k.startswith(gone)]) == 3  # unsettled
        lg = await b2.logs.get(TOPIC, 0)  # its take folds partition 0's chain
        await folder._check_gone_nodes()
        left = [k for k in await cycle_keys(b2) if k.startswith(gone)]
        assert len(left) == 1  # partition 1's entry: nobody has taken it yet
        assert await commit(b2, lg, "c") == ErrorCode.NONE  # a key of b2, not folded yet
        lg1 = await b2.logs.get(TOPIC, 1)
        await folder._check_gone_nodes()
        keys = await cycle_keys(b2)
        assert [k for k in keys if k.startswith(gone)] == []
        assert list(keys.values()) == [(False, 1)]  # b2's own, untouched
        b2.logs.cache.clear()
        assert await values(b2, lg) == tags("a", "b", "c")
        assert await values(b2, lg1) == tags("x")
    finally:
        await b2.stop()


async def test_a_stray_key_of_the_live_registration_is_deleted_once_settled(
    node: tuple[Broker, FlakyMeta],
) -> None:
    """A key of this very registration that nothing here tracks (a commit reported of
    unknown outcome whose original landed after its resolution gave up) is found by the
    owner's periodic check and deleted once settled; keys waiting for their fold stay."""
    b, meta = node
    lg = await b.logs.get(TOPIC, 0)
    assert await commit(b, lg, "a") == ErrorCode.NONE
    (late,) = await b.meta.range(CYCLES_PREFIX)  # the original, as it will land late
    await b.logs.folder.fold_all()
    assert await cycle_keys(b) == {}
    stray = f"{late.key[: late.key.rfind('/')]}/{10**12:020d}"  # an unused sequence
    await meta.inner.txn([], [Put(stray, late.value)])
    assert await commit(b, lg, "b") == ErrorCode.NONE  # a key waiting for its fold
    folder = b.logs.folder
    await folder._check_own_keys()
    await folder._check_leftovers(sorted(folder.leftovers))
    keys = await cycle_keys(b)
    assert stray not in keys and len(keys) == 1  # the stray went; "b"'s key stays
    await folder.fold_all()
    assert await cycle_keys(b) == {}
    b.logs.cache.clear()
    assert await values(b, lg) == tags("a", "b")
