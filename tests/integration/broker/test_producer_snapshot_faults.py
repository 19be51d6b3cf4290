"""Producer snapshots (broker.producer_snapshot) under the faults of a metadata commit,
deterministically: a snapshot put whose outcome is unknown (applied or not, then reported
failed), and puts by a woken zombie, which still holds a partition that has been taken
again since.

An in-process broker over a real etcd and SeaweedFS (S3), and over the real embedded
metadata store and a local-directory store (the ``node`` fixture of
test_ambiguous_commits.py, whose metadata store fails one chosen transaction)."""

from __future__ import annotations

import time

import pytest

from broker.meta.schema import ProducerSnapshot, owner_key, producers_key
from broker.partition import PartitionLog
from broker.producer_snapshot import due, write
from broker.server import Broker
from protocol.batch import read_header
from protocol.errors import ErrorCode
from protocol.records import build_batch
from tests.integration.broker.test_ambiguous_commits import TOPIC, FlakyMeta, node, puts_under

__all__ = ["node"]  # the fixture

pytestmark = pytest.mark.integration

PID = 777
PLAIN = 6  # batches of a plain producer after the idempotent one's first


async def produce(b: Broker, lg: PartitionLog, seq: int | None) -> int:
    """One committed batch of two records (its own flush cycle and segment): of producer
    ``PID`` at sequence ``seq``, or of a plain producer; returns its base offset."""
    recs = [(None, b"v%d" % j, None) for j in range(2)]
    raw = (
        build_batch(recs)
        if seq is None
        else build_batch(recs, producer_id=PID, producer_epoch=0, base_sequence=seq)
    )
    view = memoryview(bytearray(raw))
    res = lg.append(read_header(view), view)
    assert res.error == ErrorCode.NONE and res.done is not None
    b.logs.appended(lg, len(view))
    await res.done
    return res.base_offset


async def stored(b: Broker, topic: str = TOPIC) -> ProducerSnapshot | None:
    """The stored snapshot, each producer's last write checked to be a wall-clock time
    of this run and then put as 0 (so tests can compare the rest)."""
    kv = await b.meta.get(producers_key(topic, 0))
    if kv is None:
        return None
    snap = ProducerSnapshot.decode(kv.value)
    now = time.time() * 1000
    assert all(now - 3_600_000 < p[3] <= now for p in snap.producers), snap
    return ProducerSnapshot(snap.upto, tuple((p[0], p[1], p[2], 0) for p in snap.producers))


def check(lg: PartitionLog, first: int, last: int) -> tuple[ErrorCode, int | None]:
    err, dup = lg.producers.check(PID, 0, first, last)
    return err, None if dup is None else dup.base_offset


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "not-applied"])
async def test_a_snapshot_put_of_unknown_outcome_leaves_the_next_owner_right(
    node: tuple[Broker, FlakyMeta], applied: bool
) -> None:
    b, meta = node
    lg = await b.logs.get(TOPIC, 0)
    assert await produce(b, lg, 0) == 0  # the producer's sequences 0-1
    for _ in range(PLAIN):
        await produce(b, lg, None)
    end = lg.hw
    meta.arm(puts_under("/producers"), apply=applied)
    assert b.logs.maintenance is not None
    await b.logs.maintenance.run_once()  # the snapshot put fails: logged, retried later
    assert meta.hits == 1
    snap = await stored(b)
    assert snap == (ProducerSnapshot(end, ((PID, 0, ((0, 1, 0),), 0),)) if applied else None)
    assert await produce(b, lg, 2) == end  # the log moves on past the snapshot
    b.logs.drop(lg, "test: the next take starts from the store")
    taken = await b.logs.get(TOPIC, 0)
    assert taken is not lg and taken.hw == end + 2
    # applied: the snapshot, with the batch after it replayed over it; not applied: the
    # newest segments (the maintenance pass merged the small ones: they hold both)
    assert taken.snapshot_upto == (end if applied else -1)
    assert check(taken, 4, 5) == (ErrorCode.NONE, None)
    assert check(taken, 6, 7)[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert check(taken, 2, 3) == (ErrorCode.NONE, end)
    assert check(taken, 0, 1) == (ErrorCode.NONE, 0)
    assert due(taken) is not applied  # one segment since the snapshot / none stored
    assert await write(b.meta, taken)
    assert await stored(b) == ProducerSnapshot(end + 2, ((PID, 0, ((0, 1, 0), (2, 3, end)), 0),))


async def test_a_woken_zombie_writes_no_snapshot_and_releases_nothing(
    node: tuple[Broker, FlakyMeta],
) -> None:
    """The zombie's log object outlived its ownership: the partition was taken again
    (a new epoch and owner value). Neither its maintenance put nor its release, which
    carries a snapshot, may change the owner key or the snapshot."""
    b, _meta = node
    zombie = await b.logs.get(TOPIC, 0)
    assert await produce(b, zombie, 0) == 0
    b.logs.drop(zombie, "test: frozen past its ownership")
    owner = await b.logs.get(TOPIC, 0)
    assert owner.epoch == zombie.epoch + 1
    assert await produce(b, owner, 2) == 2
    assert await write(b.meta, owner)
    kept = await stored(b)
    assert kept == ProducerSnapshot(4, ((PID, 0, ((0, 1, 0), (2, 3, 2)), 0),))
    okey = await b.meta.get(owner_key(TOPIC, 0))
    assert okey is not None and okey.value == owner.owner_value
    assert not await write(b.meta, zombie)
    await b.logs._release_key(zombie, keep_producers=True)
    assert await stored(b) == kept
    okey = await b.meta.get(owner_key(TOPIC, 0))
    assert okey is not None and okey.value == owner.owner_value


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "not-applied"])
async def test_an_expirys_snapshot_rewrite_of_unknown_outcome_converges(
    node: tuple[Broker, FlakyMeta], applied: bool
) -> None:
    """Producer id expiration rewrites the snapshot without the expired producer. When
    that put's outcome is unknown, the next owner either does not know the producer
    (applied) or restores it from the old snapshot with its old last write (not
    applied), so the next pass expires it at once and the snapshot converges."""
    b, meta = node
    maintenance = b.logs.maintenance
    assert maintenance is not None
    lg = await b.logs.get(TOPIC, 0)
    assert await produce(b, lg, 0) == 0
    end = lg.hw
    await maintenance.run_once()  # the first snapshot, with the producer
    assert await stored(b) == ProducerSnapshot(end, ((PID, 0, ((0, 1, 0),), 0),))
    written = lg.producers.last_write(PID)
    later = int(time.time() * 1000) + b.config.producer_id_expiration_ms + 60_000
    meta.arm(puts_under("/producers"), apply=applied)
    await maintenance.run_once(expire_at_ms=later)  # expired; the rewrite "fails"
    assert meta.hits == 1 and len(lg.producers) == 0
    kept = await stored(b)
    assert kept == ProducerSnapshot(end, () if applied else ((PID, 0, ((0, 1, 0),), 0),))
    b.logs.drop(lg, "test: the next take starts from the store")
    taken = await b.logs.get(TOPIC, 0)
    assert taken.producers.last_write(PID) == (-1 if applied else written)
    # the next pass's steps (the partition is in its back-off after the failed put)
    await maintenance.expire_producers(taken, later - b.config.producer_id_expiration_ms)
    assert len(taken.producers) == 0
    assert due(taken) is not applied  # not applied: rewritten without it now
    assert await write(b.meta, taken)
    assert await stored(b) == ProducerSnapshot(end, ())
    assert check(taken, 10, 11) == (ErrorCode.NONE, None)  # unknown: any sequence
