"""The partition logs this broker owns: ownership, and the facade over the write path
(``broker.flush``), the read path (``broker.reads``) and maintenance
(``broker.maintenance``), which work as peers on the same ``PartitionLog`` objects and
commit through one ``Committer`` (``broker.commit``).

Ownership: the owner of a partition holds ``/owners/{t}/{p}`` under this broker's lease,
with a value naming the broker, an epoch that increases on every change of owner, and the
topic id; every manifest transaction compares it, so a broker that lost ownership can
never commit. Owners are chosen by rendezvous hashing (``broker.cluster``); a partition
held by a broker that no longer hashes to it is handed off on every membership change and
on a periodic re-check, until ownership converges. A broker whose lease may have expired
(a frozen process waking up) serves nothing until its lease is confirmed, and a broker
whose lease did expire drops every partition, and every task and cache of them, before it
registers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

from broker import producer_snapshot
from broker.commit import Committer
from broker.cycles import ChainError
from broker.flush import Flusher
from broker.fold import Folder
from broker.log_metrics import LogMetrics, first_offset, loss_reason
from broker.maintenance import Maintenance
from broker.meta.base import (
    Compare,
    Delete,
    KeyValue,
    MetaStore,
    MetaStoreError,
    Put,
)
from broker.meta.schema import (
    EndValue,
    end_key,
    owner_broker,
    owner_key,
)
from broker.partition import (
    ACTIVE,
    RELEASING,
    PartitionLog,
    SegmentMeta,
)
from broker.producer_rebuild import rebuild
from broker.reads import Reader
from broker.segment_loader import Piece
from broker.shared_sweep import SharedSweeper
from broker.take import ChainCache, Taker, take_txn, taken_log
from broker.tasks import cancel_and_wait
from broker.turns import PAUSE_S, TurnBudget
from protocol.errors import ErrorCode, KafkaProtocolError
from segments.cache import SegmentCache
from segments.format import partition_prefix
from segments.shared import is_range_key
from segments.store import ObjectStore, StoreError

if TYPE_CHECKING:
    from broker.cluster import Cluster
    from broker.config import BrokerConfig
    from broker.topics import TopicManager

log = logging.getLogger(__name__)

#: owner-key releases in flight at stop (``LogManager._release_all``)
RELEASES_AT_ONCE = 32

ACQUIRE_WAIT_S = 5.0


class LogManager:
    def __init__(
        self,
        config: BrokerConfig,
        meta: MetaStore,
        store: ObjectStore,
        cluster: Cluster,
        topics: TopicManager,
        metrics: LogMetrics | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics or LogMetrics()
        self.meta = meta
        self.store = store
        self.cluster = cluster
        self.topics = topics
        self.cache = SegmentCache(config.cache_bytes)
        self.logs: dict[tuple[str, int], PartitionLog] = {}
        self._acquiring: dict[tuple[str, int], asyncio.Task[PartitionLog]] = {}
        self._releases: set[asyncio.Task[None]] = set()
        self._reconcile_task: asyncio.Task[None] | None = None
        self._reconcile = asyncio.Event()
        # an unknown commit outcome is resolved for up to two lease TTLs
        self.committer = Committer(meta, resolve_s=max(5.0, 2.0 * config.lease_ttl_s))
        self.commit_lock = self.committer.lock
        self.flusher = Flusher(self)
        self.folder = Folder(self)
        self.chains = ChainCache()  # the cycle keys of owners gone, for the takes
        self.committer.settle = self.folder.fold_held
        self.reader = Reader(self)
        self.stats = self.flusher.stats
        self.maintenance: Maintenance | None = None
        self.shared_sweep = SharedSweeper(config, meta, lambda: self.store, self._controls)

    def _controls(self) -> bool:
        """Whether this broker runs the cluster-wide shared sweep: it is the controller and
        its lease is known alive."""
        return self.cluster.controller_id() == self.config.node_id and self.cluster.lease_valid()

    async def start(self) -> None:
        self.maintenance = Maintenance(self)
        self.maintenance.start()
        self.shared_sweep.start()
        self.flusher.start()
        self.folder.start()
        self.cluster.add_listener(self._on_membership)
        self.cluster.on_lease_lost(self._drop_all)
        self.topics.add_listener(self._on_topic)
        self._reconcile_task = asyncio.create_task(self._reconcile_loop(), name="reconcile")
        warm = getattr(self.store, "warm", None)  # S3: the client before the first read
        if warm is not None:
            try:
                await warm()
            except Exception as exc:  # the first request reports it again, as before
                log.warning("object store client not created at start: %s", exc)

    async def stop(self) -> None:
        """Flush what is buffered, release every partition, stop the flusher."""
        if self._reconcile_task is not None:
            await cancel_and_wait(self._reconcile_task)
        if self.maintenance is not None:
            await self.maintenance.stop()
        await self.shared_sweep.stop()
        for lg in list(self.logs.values()):
            lg.state = RELEASING
        await self._flush_while_leased()
        await self.flusher.stop()  # and the cycles still in flight, if it gave up
        await self.folder.stop()
        # else the next owners fold at their take: bounded, as with an unreachable store
        # every fold transaction would wait out its resolution
        with contextlib.suppress(MetaStoreError, TimeoutError):
            async with asyncio.timeout(self.config.lease_ttl_s):
                await self.folder.fold_all()
        await self._release_all(list(self.logs.values()))
        self.logs.clear()

    async def _flush_while_leased(self) -> None:
        """Flush every owned partition at stop for as long as the lease is known to
        live. A metadata store that does not answer would hold every cycle's commit for
        its resolution deadline, one cycle after another; once the lease is in doubt the
        partitions go to the next owner with it, so the stop gives up there. Giving up is
        a crash at that point for the store's state (nothing is deleted, an unknown
        outcome stays for the next owner's take) and loses nothing acknowledged: a cycle's
        records are acknowledged only after its commit, and the connections are closed."""
        task = asyncio.create_task(self.flush_all(), name="stop-flush")
        try:
            while not task.done():
                left = self.cluster.lease_left()
                if left <= 0:
                    log.warning(
                        "stop: the lease is in doubt; records not flushed by now were never"
                        " acknowledged, and the partitions go to the next owner with it"
                    )
                    return
                await asyncio.wait({task}, timeout=left)  # the lease may be renewed meanwhile
            task.result()
        finally:
            if not task.done():
                await cancel_and_wait(task)

    async def _release_all(self, lgs: list[PartitionLog]) -> None:
        """Release every owner key at stop, ``RELEASES_AT_ONCE`` at a time, within what
        is left of the lease. Past it the keys are gone with the lease (or go when it
        expires), so trying on would only delay the stop: against a metadata store that
        does not answer, every release used to wait out its own request timeout in turn,
        minutes for a few dozen partitions (docs/operations.md, "Stopping a broker"). A
        partition not released is taken by the next owner once the lease has expired."""
        left = self.cluster.lease_left()
        if not lgs:
            return
        if left <= 0:
            log.warning(
                "stop: the lease is in doubt; %d partition(s) are released when it expires",
                len(lgs),
            )
            return
        gate = asyncio.Semaphore(RELEASES_AT_ONCE)

        async def one(lg: PartitionLog) -> None:
            async with gate:
                await self._release_key(lg, keep_producers=True)

        try:
            async with asyncio.timeout(left):
                await asyncio.gather(*(one(lg) for lg in lgs))
        except TimeoutError:
            log.warning(
                "stop: releases not done within the lease's remaining %.1f s; the rest of"
                " %d partition(s) are released when it expires",
                left,
                len(lgs),
            )

    @property
    def pending_bytes(self) -> int:
        """Bytes appended on this broker and not yet committed."""
        return sum(lg.pending_bytes for lg in self.logs.values())

    # -- the peers, through the facade ---------------------------------------------------
    def appended(self, lg: PartitionLog, nbytes: int) -> None:
        self.flusher.appended(lg, nbytes)

    async def flush(self, logs: list[PartitionLog]) -> None:
        await self.flusher.flush(logs)

    async def flush_all(self) -> None:
        """Flush every owned partition (shutdown)."""
        await self.flusher.flush(list(self.logs.values()))

    def object_key(self, lg: PartitionLog, seg: SegmentMeta) -> str:
        return self.reader.object_key(lg, seg)

    async def read(self, lg: PartitionLog, offset: int, max_bytes: int) -> list[memoryview]:
        out = await self.reader.read(lg, offset, max_bytes)
        if out:
            self.metrics.served(lg.topic, out, first_offset(out[0]), self.reader.last_read)
        return out

    async def segment_batches(self, lg: PartitionLog, seg: SegmentMeta) -> bytes:
        # bytes-like: a read-only memoryview when S3 read it directly (segments/s3_direct.py);
        # every caller only parses it (iter_segment_batches)
        return await self.reader.segment_batches(lg, seg)  # type: ignore[return-value]

    async def discard(self, lg: PartitionLog, keys: list[str]) -> None:
        """Delete segment objects that this owner wrote under its own writer-unique names
        and certainly never committed: nothing else can name them. This process writes
        every segment with its index inside (docs/format.md): there is no index object."""
        for key in keys:
            self.cache.evict(key)
            if is_range_key(key):  # its shared object holds other partitions' segments:
                continue  # the shared sweep deletes it once none is named
            try:
                await self.store.delete(key)
            except StoreError as exc:  # a later owner's sweep collects it
                log.warning("could not delete uncommitted object %s: %s", key, exc)

    # -- ownership ----------------------------------------------------------------------
    def high_watermark(self, topic: str, partition: int) -> int:
        lg = self.logs.get((topic, partition))
        return lg.hw if lg is not None else -1

    async def get(self, topic: str, partition: int) -> PartitionLog:
        """The local log of (topic, partition), acquiring ownership if this broker is the
        partition's owner. Raises KafkaProtocolError(NOT_LEADER_OR_FOLLOWER, ...) — also
        when the metadata store cannot be reached or this broker's lease is in doubt."""
        info = self.topics.get(topic)
        if info is None or not 0 <= partition < info.partitions:
            raise KafkaProtocolError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        if not self.cluster.lease_valid():
            self.cluster.check_lease()
            raise KafkaProtocolError(ErrorCode.NOT_LEADER_OR_FOLLOWER, "lease not confirmed")
        lg = self.logs.get((topic, partition))
        if lg is not None and lg.state == ACTIVE:
            return lg
        if lg is not None or not self.cluster.owns_partition(topic, partition):
            raise KafkaProtocolError(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        tp = (topic, partition)
        task = self._acquiring.get(tp)
        if task is None:
            task = asyncio.create_task(self._acquire(topic, partition, info.topic_id))
            self._acquiring[tp] = task
            task.add_done_callback(lambda _t: self._acquiring.pop(tp, None))
        try:
            return await asyncio.shield(task)
        except MetaStoreError as exc:
            log.warning("taking %s-%d failed: %s", topic, partition, exc)
            raise KafkaProtocolError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER, "metadata store unavailable"
            ) from exc
        except ChainError as exc:  # nothing taken: the partition waits for an operator
            log.error("taking %s-%d refused: %s", topic, partition, exc)
            raise KafkaProtocolError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER, "cycle keys unreadable"
            ) from exc
        except StoreError as exc:
            log.warning("taking %s-%d failed: producer state not read: %s", topic, partition, exc)
            raise KafkaProtocolError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER, "object store unavailable"
            ) from exc

    async def _acquire(self, topic: str, partition: int, topic_id: uuid.UUID) -> PartitionLog:
        okey, ekey = owner_key(topic, partition), end_key(topic, partition)
        deadline = asyncio.get_running_loop().time() + ACQUIRE_WAIT_S
        while True:
            owner = await self.meta.get(okey)
            end = await self.meta.get(ekey)
            # another broker holds it: wait for its hand-off (or its lease to expire). A
            # key naming this broker is a log it dropped (or a previous incarnation's)
            if owner is not None and owner_broker(owner.value) != self.config.node_id:
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    raise KafkaProtocolError(ErrorCode.NOT_LEADER_OR_FOLLOWER)
                await self._wait_deleted(okey, owner.mod_revision, remaining)
                continue
            lg = await self._take(topic, partition, topic_id, owner, end)
            if lg is not None:
                return lg

    async def _take(
        self,
        topic: str,
        partition: int,
        topic_id: uuid.UUID,
        owner: KeyValue | None,
        end: KeyValue | None,
    ) -> PartitionLog | None:
        prev = EndValue.decode(end.value) if end is not None else EndValue(0, 0, 0)
        # our own dropped log: no commit of ours may land between the chain's read and
        # the take (a cycle commit does not move the end key the take compares)
        own = prev.broker == self.config.node_id
        async with self.committer.lock if own else contextlib.nullcontext():
            reg = self.cluster.reg if self.config.cycle_keys_min_partitions > 0 else 0
            taken = await take_txn(
                self.meta,
                self.chains,
                Taker(self.config.node_id, self.cluster.lease_id, reg),
                (topic, partition, topic_id),
                owner,
                end,
                prev,
            )
        if taken is None:
            return None
        lg = taken_log(self.config.node_id, (topic, partition, topic_id), prev, taken)
        if reg:  # it commits through cycle keys: its end values name it
            lg.owner_broker, lg.owner_reg = self.config.node_id, reg
        res = taken[0]
        snap = res.gets[2][0].value if res.gets[2] else None
        try:
            await rebuild(
                lg,
                partial(self.reader.segment_data, lg, shared=True),
                partial(self._ahead, lg),
                snap,
            )
        except StoreError:  # not serving without its producer state: give the key back
            await self._release_key(lg)
            raise
        self.logs[(topic, partition)] = lg
        self.metrics.ownership_acquired()
        if self.maintenance is not None:
            self.maintenance.acquired(lg)
        log.info(
            "took ownership of %s-%d at epoch %d (log end %d, %d segments)",
            topic,
            partition,
            lg.epoch,
            lg.next_offset,
            len(lg.segments),
        )
        if not self.cluster.owns_partition(topic, partition):
            self._reconcile.set()  # membership moved while we took it: hand it on
        return lg

    def _ahead(self, lg: PartitionLog, segs: Sequence[SegmentMeta]) -> None:
        """Load ``segs`` in the background as the read path does (bounded per broker)."""
        self.reader.loader.readahead(Piece.whole(self.object_key(lg, s), s) for s in segs)

    async def _wait_deleted(self, key: str, revision: int, timeout: float) -> None:
        watch = self.meta.watch(key, start_revision=revision + 1)
        try:
            async with asyncio.timeout(timeout):
                async for ev in watch:
                    if ev.type == "delete":
                        return
        except TimeoutError:
            return
        finally:
            await watch.aclose()

    # -- convergence ----------------------------------------------------------------------
    def _on_membership(self) -> None:
        self._reconcile.set()

    async def _reconcile_loop(self) -> None:
        """Hand off every partition this broker holds but no longer hashes to: on each
        membership change, after each take, and every half lease TTL in case an event
        came while a take was in flight (ownership converges, re-checked until it does)."""
        interval = max(0.5, self.config.lease_ttl_s / 2)
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._reconcile.wait()
            self._reconcile.clear()
            await self.reconcile_once()

    async def reconcile_once(self) -> int:
        """Start the hand-off of every partition held here that hashes to another broker
        now; returns how many. A pause of the check every ``ITEMS_PER_TURN``
        partitions or every millisecond (a rendezvous hash per partition: 4,000 held the
        loop 5-12 ms in one piece; broker/turns.py); each partition's state is read when
        its turn comes."""
        started = 0
        turn = TurnBudget()
        for (topic, partition), lg in list(self.logs.items()):
            if turn.due():
                await asyncio.sleep(PAUSE_S)
            if lg.state == ACTIVE and not self.cluster.owns_partition(topic, partition):
                task = asyncio.create_task(self._hand_off(lg))
                self._releases.add(task)
                task.add_done_callback(self._releases.discard)
                started += 1
        return started

    async def _hand_off(self, lg: PartitionLog) -> None:
        lg.state = RELEASING
        await self.flush([lg])
        if lg.unfolded:  # else its next owner folds them at its take
            with contextlib.suppress(MetaStoreError):
                await self.folder.fold([lg])
        await self._release_key(lg, keep_producers=True)
        if self.logs.get((lg.topic, lg.partition)) is lg:
            self.logs.pop((lg.topic, lg.partition), None)
            self.metrics.ownership_lost("handoff")
        self._forget(lg)
        lg.close(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        log.info("handed off %s-%d", lg.topic, lg.partition)

    async def _release_key(self, lg: PartitionLog, *, keep_producers: bool = False) -> None:
        """Delete the owner key if it is still ``lg``'s. ``keep_producers``: with it, put
        the partition's producer snapshot (``broker.producer_snapshot``; not after a
        take that could not read the producer state)."""
        okey = owner_key(lg.topic, lg.partition)
        ops: list[Put | Delete] = [Delete(okey)]
        snap = producer_snapshot.put_op(lg) if keep_producers else None
        if snap is not None:
            ops.insert(0, snap)
        with contextlib.suppress(MetaStoreError):
            await self.meta.txn([Compare(okey, "value", "==", lg.owner_value)], ops)

    def drop(self, lg: PartitionLog, why: str) -> None:
        """Stop serving ``lg`` at once (fenced, or its state is in doubt): its appends fail
        with NOT_LEADER_OR_FOLLOWER, maintenance forgets it, its cache entries go. The
        next request takes the partition afresh from the metadata store."""
        if self.logs.get((lg.topic, lg.partition)) is lg:
            self.logs.pop((lg.topic, lg.partition), None)
            self.metrics.ownership_lost(loss_reason(why))
            log.warning("dropped %s-%d (epoch %d): %s", lg.topic, lg.partition, lg.epoch, why)
        self._forget(lg)
        lg.close(ErrorCode.NOT_LEADER_OR_FOLLOWER)

    def _forget(self, lg: PartitionLog) -> None:
        if self.maintenance is not None:
            self.maintenance.forget(lg)
        self.cache.evict_prefix(partition_prefix(self.config.namespace, lg.topic, lg.partition))

    def _drop_all(self) -> None:
        """The lease expired: every owner key of this broker is gone. Stop everything."""
        for lg in list(self.logs.values()):
            self.drop(lg, "broker lease expired")
        self.logs.clear()

    def _on_topic(self, name: str, info: object) -> None:
        for (topic, partition), lg in list(self.logs.items()):
            if topic == name and (info is None or lg.topic_id != getattr(info, "topic_id", None)):
                self.logs.pop((topic, partition), None)
                self.metrics.ownership_lost("topic_deleted")
                self._forget(lg)
                lg.close(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        if info is None:
            self.cache.evict_prefix(f"{self.config.namespace}/{name}/")
