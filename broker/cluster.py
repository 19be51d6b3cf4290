"""Cluster membership and ownership (docs/architecture.md, ownership).

Every broker registers ``/brokers/{id}`` under a lease it keeps alive; a broker's death is
its lease expiring. The registration says whether the broker serves: it is written "not
serving" and marked serving once the listeners accept connections (``serve``), and "not
serving" again when the broker stops (``withdraw``). Owners of partitions, groups and
transactions are chosen by rendezvous hashing over the serving brokers, so a starting or
stopping broker is handed nothing while its port refuses clients, every broker computes
the same answer from the same membership, and
Metadata/FindCoordinator name the owner directly. The owner itself then takes the leased
``/owners/...`` key (see ``broker.logs``); that key, not the hash, is what fences writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from broker.config import BrokerConfig
from broker.meta.base import Compare, Get, LeaseExpiredError, MetaStore, MetaStoreError, Put
from broker.meta.schema import (
    BROKERS_PREFIX,
    OWNERS_PREFIX,
    BrokerRecord,
    broker_id_of,
    broker_key,
    owner_of_key,
)
from broker.tasks import cancel_and_wait

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str | None = None
    # every advertised listener: (name, host, port); empty for a plaintext-only broker
    endpoints: tuple[tuple[str, str, int], ...] = ()

    def address(self, listener: str | None) -> tuple[str, int]:
        """The advertised (host, port) of ``listener`` (the client's own listener), or
        the broker's default address when it has no such listener."""
        if listener is not None:
            for name, host, port in self.endpoints:
                if name == listener:
                    return host, port
        return self.host, self.port


def _score(key: str, node_id: int) -> int:
    digest = hashlib.blake2b(f"{key}\x00{node_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous(key: str, brokers: list[BrokerInfo]) -> BrokerInfo | None:
    """The broker with the highest hash score for ``key`` (stable under membership change
    for every key whose winner did not leave)."""
    best: BrokerInfo | None = None
    best_score = -1
    for b in brokers:
        s = _score(key, b.node_id)
        if s > best_score:
            best, best_score = b, s
    return best


def partition_key(topic: str, partition: int) -> str:
    """The rendezvous key of a partition: its owner is ``rendezvous(partition_key(...))``."""
    return f"p\x00{topic}\x00{partition}"


WATCH_RETRY_S = 0.5  # pause after a failed watch (metadata store down) before a new one
WITHDRAW_TIMEOUT_S = 2.0  # a stop's "not serving" mark waits no longer for the store


def _ignore(_delay: float) -> None:
    return None


class Cluster:
    """This broker's registration and the live membership it sees."""

    def __init__(self, meta: MetaStore, config: BrokerConfig) -> None:
        self.meta = meta
        self.config = config
        endpoints = tuple(
            (x.name, x.advertised_host, x.advertised_port) for x in config.security.listeners
        )
        self.me = BrokerInfo(
            config.node_id, config.advertised_host, config.advertised_port, config.rack, endpoints
        )
        self.lease_id = 0
        # the create revision of this registration's ``/brokers/{id}``: the fence of its
        # cycle-key commits (broker/fold.py); a new registration gets a new one
        self.reg = 0
        # the serving brokers; this one from ``serve`` on, a stop's ``withdraw`` too
        # (its own record's events are not read back: ``_counted`` is the truth here)
        self._brokers: dict[int, BrokerInfo] = {}
        self.serving = False  # what the registration says
        self._counted = False  # whether this broker counts itself
        # held while the registration is written (``_register``, ``serve``, ``withdraw``)
        # so that a re-registration after a lost lease writes the latest ``serving``
        self._reg_lock = asyncio.Lock()
        self._owners: dict[tuple[str, int], tuple[int, int]] = {}
        self._listeners: list[Callable[[], None]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._lost_lease: list[Callable[[], None]] = []
        self.ready = asyncio.Event()
        # loop time until which the lease is known to be alive: the send time of the last
        # successful refresh plus the TTL granted. Past it (a frozen process waking up,
        # an unreachable store) the broker serves nothing until the lease is confirmed
        self._lease_until = 0.0
        self._poke = asyncio.Event()
        self.stats = {"lease_refreshes": 0, "lease_losses": 0, "max_refresh_gap_s": 0.0}
        # told how late each keep-alive wake-up was (broker/log_metrics.py, /healthz)
        self.on_keepalive: Callable[[float], None] = _ignore
        # loop time the lease refresh in flight was sent (None: none in flight); a refresh
        # that never returns would let the lease expire unnoticed (/healthz reports it)
        self.refresh_since: float | None = None

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        await self._register()
        rev = await self._sync_brokers()
        self._tasks.append(asyncio.create_task(self._keepalive(), name="lease-keepalive"))
        self._tasks.append(asyncio.create_task(self._watch_brokers(rev), name="watch-brokers"))
        orev = await self._sync_owners()
        self._tasks.append(asyncio.create_task(self._watch_owners(orev), name="watch-owners"))
        self.ready.set()

    async def _sync_brokers(self) -> int:
        """Read the live brokers; returns the store revision the read saw."""
        res = await self.meta.txn([], [Get(BROKERS_PREFIX, True)])
        brokers: dict[int, BrokerInfo] = {}
        for kv in res.gets[0]:
            node = broker_id_of(kv.key)
            info = self._decode_broker(kv.value, node) if node is not None else None
            if info is not None and info.node_id != self.me.node_id:
                brokers[info.node_id] = info
        if self._counted:
            brokers[self.me.node_id] = self.me
        self._brokers = brokers
        return res.revision

    async def _sync_owners(self) -> int:
        res = await self.meta.txn([], [Get(OWNERS_PREFIX, True)])
        self._owners.clear()
        for kv in res.gets[0]:
            self._apply_owner("put", kv.key, kv.value)
        return res.revision

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks)
        self._tasks.clear()
        # a lease in doubt (the store not answering) expires by itself: asking would
        # only add the store's request timeout to the stop
        if self.lease_id and self.lease_valid():
            with contextlib.suppress(MetaStoreError):
                await self.meta.revoke_lease(self.lease_id)
        self.lease_id = 0

    def _record(self) -> bytes:
        me = self.me
        return BrokerRecord(me.host, me.port, me.rack, me.endpoints, self.serving).to_json()

    async def serve(self) -> None:
        """Mark the registration serving (call it once the listeners accept connections):
        this broker counts itself at once, and every other broker once it sees the mark."""
        self._counted = True
        self._brokers[self.me.node_id] = self.me
        self._notify()
        await self._mark(True)

    async def withdraw(self) -> None:
        """Mark the registration not serving (the broker is stopping): the others place
        this broker's partitions and groups elsewhere at once, and take each partition
        as soon as this broker releases it, where they would wait for its lease to be
        revoked. This broker's own view is left as it is (its stop releases what it
        holds). Nothing is written while the lease is in doubt, and a store slow to answer
        gets ``WITHDRAW_TIMEOUT_S`` at most: the flush that follows needs the lease."""
        if self.lease_id and self.lease_valid():
            with contextlib.suppress(MetaStoreError, TimeoutError):
                async with asyncio.timeout(min(WITHDRAW_TIMEOUT_S, self.lease_left())):
                    await self._mark(False)

    async def _mark(self, serving: bool) -> None:
        async with self._reg_lock:
            self.serving = serving
            key = broker_key(self.me.node_id)
            res = await self.meta.txn(
                [Compare(key, "create_revision", "==", self.reg)],
                [Put(key, self._record(), self.lease_id)],
            )
        if not res.succeeded:  # the lease ran out: the re-registration writes ``serving``
            log.warning("registration gone while marking it serving=%s", serving)

    async def _register(self) -> None:
        async with self._reg_lock:
            await self._register_locked()

    async def _register_locked(self) -> None:
        """Take ``/brokers/{id}`` under a fresh lease.

        A previous incarnation of this node id (killed with ``kill -9``) may still hold
        the key until its lease expires; we wait for that, watching the key.
        """
        key = broker_key(self.me.node_id)
        self.lease_id = await self.meta.grant_lease(self.config.lease_ttl_s)
        self._lease_until = asyncio.get_running_loop().time() + self.config.lease_ttl_s
        while True:
            res = await self.meta.txn(
                [Compare(key, "create_revision", "==", 0)],
                [Put(key, self._record(), self.lease_id)],
            )
            if res.succeeded:
                self.reg = res.revision
                return
            log.warning(
                "node id %d is still registered (previous process?); waiting up to %ds "
                "for its lease to expire",
                self.me.node_id,
                self.config.lease_ttl_s,
            )
            await self._wait_deleted(key, res.revision)
            await self._renew_own_lease()

    async def _renew_own_lease(self) -> None:
        """Our lease kept running while we waited for the previous incarnation's: renew
        it before registering under it, or take a new one if it ran out meanwhile (a
        wait as long as the TTL let it expire just after registration)."""
        try:
            ttl = await self.meta.refresh_lease(self.lease_id)
        except LeaseExpiredError:
            ttl = 0
        if ttl <= 0:
            self.lease_id = await self.meta.grant_lease(self.config.lease_ttl_s)
            ttl = self.config.lease_ttl_s
        self._lease_until = asyncio.get_running_loop().time() + ttl

    async def _wait_deleted(self, key: str, revision: int) -> None:
        watch = self.meta.watch(key, start_revision=revision + 1)
        try:
            async with asyncio.timeout(self.config.lease_ttl_s * 3 + 5):
                async for ev in watch:
                    if ev.key == key and ev.type == "delete":
                        return
        except TimeoutError:
            return
        finally:
            await watch.aclose()

    def lease_valid(self) -> bool:
        """Whether this broker's lease is known to be alive right now."""
        return asyncio.get_running_loop().time() < self._lease_until

    def lease_left(self) -> float:
        """Seconds this broker's lease is known to live on (0: lapsed or in doubt)."""
        return max(0.0, self._lease_until - asyncio.get_running_loop().time())

    def check_lease(self) -> None:
        """Refresh the lease now (a request found it in doubt)."""
        self._poke.set()

    async def _keepalive(self) -> None:
        loop = asyncio.get_running_loop()
        interval = max(0.2, self.config.lease_ttl_s / 3)
        last = loop.time()
        while True:
            due = loop.time() + interval
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):  # a timer, or a poke
                    await self._poke.wait()
            self._poke.clear()
            sent = loop.time()
            self.on_keepalive(max(0.0, sent - due))
            gap = sent - last
            if gap > self.stats["max_refresh_gap_s"]:
                self.stats["max_refresh_gap_s"] = gap
            self.refresh_since = sent
            try:
                ttl = await self.meta.refresh_lease(self.lease_id)
                self.refresh_since = None
                self._lease_until = sent + (ttl if ttl > 0 else self.config.lease_ttl_s)
                self.stats["lease_refreshes"] += 1
                last = sent
            except LeaseExpiredError:
                self.refresh_since = None
                self._lease_until = 0.0
                self.stats["lease_losses"] += 1
                log.error("broker lease expired: dropping all ownership and re-registering")
                for cb in self._lost_lease:
                    cb()
                await self._reregister()
                last = loop.time()
            except MetaStoreError as exc:
                self.refresh_since = None
                log.warning("lease refresh failed: %s", exc)

    async def _reregister(self) -> None:
        """Register again under a new lease, retrying until the store answers."""
        while True:
            try:
                await self._register()
                self._notify()
                return
            except MetaStoreError as exc:
                log.warning("re-registration failed (%s); retrying", exc)
                await asyncio.sleep(WATCH_RETRY_S)  # back off before the next attempt

    async def _watch_brokers(self, revision: int) -> None:
        while True:
            watch = self.meta.watch(BROKERS_PREFIX, start_revision=revision + 1)
            try:
                async for ev in watch:
                    revision = ev.mod_revision
                    node = broker_id_of(ev.key)
                    if node is None or node == self.me.node_id:
                        continue
                    info = None if ev.type == "delete" else self._decode_broker(ev.value, node)
                    if info is None:  # gone, or not serving
                        if self._brokers.pop(node, None) is None:
                            continue  # it was not counted: nothing moves
                    elif self._brokers.get(node) == info:
                        continue
                    else:
                        self._brokers[node] = info
                    self._notify()
            except MetaStoreError as exc:
                log.warning("broker watch failed (%s); resuming", exc)
                revision = await self._resync(self._sync_brokers)
                self._notify()
            finally:
                await watch.aclose()

    async def _watch_owners(self, revision: int) -> None:
        while True:
            watch = self.meta.watch(OWNERS_PREFIX, start_revision=revision + 1)
            try:
                async for ev in watch:
                    revision = ev.mod_revision
                    self._apply_owner(ev.type, ev.key, ev.value)
            except MetaStoreError as exc:
                log.warning("owner watch failed (%s); resuming", exc)
                revision = await self._resync(self._sync_owners)
            finally:
                await watch.aclose()

    async def _resync(self, sync: Callable[[], Awaitable[int]]) -> int:
        """After a failed watch: read the whole state again (events may have been missed,
        or compacted away while the store was out of reach) and watch from there."""
        while True:
            await asyncio.sleep(WATCH_RETRY_S)  # back off before reconnecting
            try:
                return await sync()
            except MetaStoreError as exc:
                log.warning("re-reading cluster state failed (%s); retrying", exc)

    def _apply_owner(self, kind: str, key: str, value: bytes) -> None:
        tp = owner_of_key(key)
        if tp is None:
            return
        if kind == "delete":
            self._owners.pop(tp, None)
            return
        try:
            d = json.loads(value)
            self._owners[tp] = (int(d["broker"]), int(d["epoch"]))
        except (ValueError, KeyError, TypeError):
            return

    def leader_epoch(self, topic: str, partition: int) -> int:
        """The epoch of the partition's current owner key, or -1 when nobody holds it."""
        owner = self._owners.get((topic, partition))
        return owner[1] if owner else -1

    def _decode_broker(self, value: bytes, node_id: int) -> BrokerInfo | None:
        """The broker of a registration, or None when it does not serve (or is
        unreadable)."""
        try:
            rec = BrokerRecord.from_json(value)
        except ValueError:
            log.warning("unreadable registration of broker %d ignored", node_id)
            return None
        if not rec.serving:
            return None
        return BrokerInfo(node_id, rec.host, rec.port, rec.rack, rec.listeners)

    def _notify(self) -> None:
        for cb in list(self._listeners):
            try:
                cb()
            except Exception:  # a listener bug must not kill the watch
                log.exception("membership listener failed")

    # -- queries ------------------------------------------------------------------------
    def add_listener(self, cb: Callable[[], None]) -> None:
        self._listeners.append(cb)

    def on_lease_lost(self, cb: Callable[[], None]) -> None:
        self._lost_lease.append(cb)

    def brokers(self) -> list[BrokerInfo]:
        return sorted(self._brokers.values(), key=lambda b: b.node_id)

    def broker(self, node_id: int) -> BrokerInfo | None:
        return self._brokers.get(node_id)

    def controller_id(self) -> int:
        return min(self._brokers) if self._brokers else self.me.node_id

    def partition_owner(self, topic: str, partition: int) -> BrokerInfo:
        return rendezvous(partition_key(topic, partition), self.brokers()) or self.me

    def owns_partition(self, topic: str, partition: int) -> bool:
        return self.partition_owner(topic, partition).node_id == self.me.node_id

    def holder(self, topic: str, partition: int) -> int | None:
        """The broker whose owner key holds the partition now, or None when nobody does
        (``partition_owner`` is who should hold it)."""
        owner = self._owners.get((topic, partition))
        return owner[0] if owner else None

    def group_coordinator(self, group_id: str) -> BrokerInfo:
        return rendezvous(f"g\x00{group_id}", self.brokers()) or self.me

    def owns_group(self, group_id: str) -> bool:
        return self.group_coordinator(group_id).node_id == self.me.node_id
