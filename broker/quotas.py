"""Client quotas (issue 12): produce and fetch byte rates per user and client id, kept in
the metadata store (``/quotas/...``, ``broker/meta/schema.py``) and enforced the way
Kafka's ClientQuotaManager does (docs/operations.md, "Client quotas").

Resolution is Kafka's default quota callback: the first entity, in this order, that sets
the quota defines it, and every client it covers shares one rate at that level (user
``u`` and client ``c``; ``<default>`` is the default entity):

    user=u,client-id=c   user=u,client-id=<default>   user=u
    user=<default>,client-id=c   user=<default>,client-id=<default>   user=<default>
    client-id=c   client-id=<default>

The user is the connection's authenticated principal name when the security layer sets
one on the request context, else ``ANONYMOUS`` (Kafka's name for an unauthenticated
client). Rates are Kafka's: 11 samples of 1 s; when a request's bytes take the rate
above the bound, the delay is ``(rate - bound) / bound * window`` (the time without
traffic that brings the rate back to the bound), returned as ``throttle_time_ms`` and
applied by muting the connection that long once the response is sent (KIP-219).

``QuotaStore`` keeps the records: a snapshot of ``/quotas/`` followed by a watch (resync
on failure), and the AlterClientQuotas / DescribeClientQuotas logic.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from broker.meta.base import Compare, Delete, Get, KeyValue, MetaStore, MetaStoreError, Put
from broker.meta.schema import QUOTAS_PREFIX, QuotaEntity, QuotaRecord, quota_key
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)

PRODUCE = "producer_byte_rate"
FETCH = "consumer_byte_rate"
ENFORCED = (PRODUCE, FETCH)
ENTITY_TYPES = ("user", "client-id")
ANONYMOUS = "ANONYMOUS"
SAMPLES = 11  # Kafka's quota.window.num
WINDOW_MS = 1000  # Kafka's quota.window.size.seconds, in ms
_RETRY_S = 0.5
MAX_RATES = 10_000  # measured (quota, user, client) rates before idle ones are dropped


class Rate:
    """Kafka's sampled rate (``metrics.stats.Rate``): ``SAMPLES`` windows of
    ``WINDOW_MS``; the elapsed time counts at least ``SAMPLES - 1`` full windows."""

    __slots__ = ("_samples",)

    def __init__(self) -> None:
        self._samples: deque[list[float]] = deque()  # [start ms, total]

    def _purge(self, now: float) -> None:
        while self._samples and now - self._samples[0][0] >= SAMPLES * WINDOW_MS:
            self._samples.popleft()

    def record(self, value: float, now: float) -> None:
        self._purge(now)
        if not self._samples or now - self._samples[-1][0] >= WINDOW_MS:
            self._samples.append([now, 0.0])
        self._samples[-1][1] += value

    def window_ms(self, now: float) -> float:
        self._purge(now)
        elapsed = now - self._samples[0][0] if self._samples else 0.0
        full = int(elapsed // WINDOW_MS)
        if full < SAMPLES - 1:
            elapsed += (SAMPLES - 1 - full) * WINDOW_MS
        return elapsed

    def per_second(self, now: float) -> float:
        window = self.window_ms(now)
        return sum(s[1] for s in self._samples) / (window / 1000.0) if window > 0 else 0.0


def user_of(ctx: Any) -> str:
    """The principal name the security layer put on the request context, if any."""
    principal = getattr(ctx, "principal", None)
    if principal is None:
        return ANONYMOUS
    return principal if isinstance(principal, str) else str(getattr(principal, "name", principal))


def _candidates(user: str, client: str) -> list[QuotaEntity]:
    u, c = ("user", user), ("client-id", client)
    du, dc = ("user", None), ("client-id", None)
    order = [(u, c), (u, dc), (u,), (du, c), (du, dc), (du,), (c,), (dc,)]
    return [tuple(sorted(e, key=lambda part: part[0])) for e in order]


@dataclass(slots=True)
class QuotaError:
    code: ErrorCode
    message: str


class QuotaStore:
    """The client-quota records, cached from the metadata store, and their enforcement."""

    def __init__(self, meta: MetaStore, clock: Any = time.monotonic) -> None:
        self._meta = meta
        self._clock = clock
        self.records: dict[QuotaEntity, QuotaRecord] = {}
        self._revs: dict[str, int] = {}
        self._rates: dict[tuple[str, str, str], Rate] = {}
        self._task: asyncio.Task[None] | None = None

    # -- cache --------------------------------------------------------------------------
    async def start(self) -> None:
        revision = await self._sync()
        self._task = asyncio.create_task(self._watch(revision), name="quotas-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def _apply(self, key: str, value: bytes | None, revision: int) -> None:
        if revision < self._revs.get(key, 0):
            return
        self._revs[key] = revision
        if value is None:
            for entity in [e for e in self.records if quota_key(e) == key]:
                del self.records[entity]
            return
        try:
            rec = QuotaRecord.from_json(value)
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring malformed quota record %s", key)
            return
        self.records[rec.entity] = rec

    async def _sync(self) -> int:
        res = await self._meta.txn([], [Get(QUOTAS_PREFIX, prefix=True)])
        self.records.clear()
        for kv in res.gets[0]:
            self._apply(kv.key, kv.value, kv.mod_revision)
        return res.revision

    async def _watch(self, revision: int) -> None:
        while True:
            try:
                async for ev in self._meta.watch(QUOTAS_PREFIX, start_revision=revision + 1):
                    revision = max(revision, ev.mod_revision)
                    value = None if ev.type == "delete" else ev.value
                    self._apply(ev.key, value, ev.mod_revision)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("quotas watch failed (%s); resyncing", exc)
                await asyncio.sleep(_RETRY_S)  # back off before reconnecting, not a poll
            try:
                revision = await self._sync()
            except MetaStoreError as exc:
                log.warning("quotas resync failed: %s", exc)

    # -- enforcement --------------------------------------------------------------------
    def bound(self, kind: str, user: str, client: str) -> tuple[float, tuple[str, str, str]]:
        """The quota of ``kind`` for (user, client) and the key of the rate it is measured
        on; bound 0 when no quota applies."""
        for entity in _candidates(user, client):
            rec = self.records.get(entity)
            if rec is not None and kind in rec.quotas:
                types = {t for t, _n in entity}
                key = (
                    kind,
                    user if "user" in types else "",
                    client if "client-id" in types else "",
                )
                return rec.quotas[kind], key
        return 0.0, (kind, "", "")

    def record(self, kind: str, user: str, client: str, nbytes: int) -> int:
        """Record ``nbytes`` against the quota; the throttle time in ms (0: within it)."""
        if not self.records:
            return 0
        bound, key = self.bound(kind, user, client)
        if bound <= 0:
            return 0
        now = self._clock() * 1000.0
        rate = self._rates.get(key)
        if rate is None:
            if len(self._rates) >= MAX_RATES:
                self._forget_idle(now)
            rate = self._rates[key] = Rate()
        rate.record(nbytes, now)
        return self._throttle(rate, bound, now)

    def _forget_idle(self, now: float) -> None:
        """Drop the rates of clients idle for a whole window (Kafka expires idle quota
        sensors too), so client ids that come and go cannot grow the table for ever."""
        for key in [k for k, r in self._rates.items() if r.per_second(now) == 0.0]:
            del self._rates[key]

    def current_throttle(self, kind: str, user: str, client: str) -> int:
        """The throttle time owed now, recording nothing (a fetch over quota is answered
        empty before any data is read)."""
        if not self.records:
            return 0
        bound, key = self.bound(kind, user, client)
        rate = self._rates.get(key)
        if bound <= 0 or rate is None:
            return 0
        return self._throttle(rate, bound, self._clock() * 1000.0)

    @staticmethod
    def _throttle(rate: Rate, bound: float, now: float) -> int:
        observed = rate.per_second(now)
        if observed <= bound:
            return 0
        return round((observed - bound) / bound * rate.window_ms(now))

    # -- admin --------------------------------------------------------------------------
    def describe(
        self, components: Iterable[tuple[str, int, str | None]], strict: bool
    ) -> list[QuotaRecord] | QuotaError:
        """Records matching DescribeClientQuotas filter components (entity type, match
        type 0 exact / 1 default / 2 any, name)."""
        filters: dict[str, tuple[int, str | None]] = {}
        for etype, match, name in components:
            if etype in filters:
                return QuotaError(ErrorCode.INVALID_REQUEST, f"entity type {etype} twice")
            if match not in (0, 1, 2):
                return QuotaError(ErrorCode.INVALID_REQUEST, f"unknown match type {match}")
            filters[etype] = (match, name)
        out = []
        for entity, rec in sorted(self.records.items(), key=lambda kv: quota_key(kv[0])):
            names = dict(entity)
            if strict and set(names) != set(filters):
                continue
            if not all(_matches(names, t, m, n) for t, (m, n) in filters.items()):
                continue
            out.append(rec)
        return out

    async def alter(
        self, entity: QuotaEntity, ops: list[tuple[str, float, bool]], validate_only: bool
    ) -> QuotaError | None:
        """Apply one AlterClientQuotas entry (key, value, remove) with compare-and-set."""
        error = check_entity(entity) or check_ops(ops)
        if error is not None or validate_only:
            return error
        key = quota_key(entity)
        for _attempt in range(5):
            res = await self._meta.txn([], [Get(key)])
            current: KeyValue | None = res.gets[0][0] if res.gets[0] else None
            quotas = dict(QuotaRecord.from_json(current.value).quotas) if current else {}
            for name, value, remove in ops:
                if remove:
                    quotas.pop(name, None)
                else:
                    quotas[name] = value
            rev = current.mod_revision if current else 0
            op = (
                Put(key, QuotaRecord(entity, MappingProxyType(quotas)).to_json())
                if quotas
                else Delete(key)
            )
            done = await self._meta.txn([Compare(key, "mod_revision", "==", rev)], [op])
            if done.succeeded:
                self._apply(key, op.value if isinstance(op, Put) else None, done.revision)
                return None
        return QuotaError(ErrorCode.UNKNOWN_SERVER_ERROR, "concurrent quota updates; retry")


def _matches(names: dict[str, str | None], etype: str, match: int, name: str | None) -> bool:
    if etype not in names:
        return False
    if match == 0:
        return names[etype] == name and name is not None
    if match == 1:
        return names[etype] is None
    return names[etype] is not None


def check_entity(entity: QuotaEntity) -> QuotaError | None:
    types = [t for t, _n in entity]
    if not types or len(set(types)) != len(types):
        return QuotaError(ErrorCode.INVALID_REQUEST, "an entity names each type once")
    for t in types:
        if t not in ENTITY_TYPES:
            why = "connection-rate quotas per IP are not enforced" if t == "ip" else "unknown"
            return QuotaError(ErrorCode.INVALID_REQUEST, f"entity type {t!r}: {why}")
    return None


def check_ops(ops: list[tuple[str, float, bool]]) -> QuotaError | None:
    for name, value, remove in ops:
        if name not in ENFORCED:
            return QuotaError(
                ErrorCode.INVALID_REQUEST,
                f"quota {name!r} is not enforced here (only {', '.join(ENFORCED)})",
            )
        if not remove and not (
            math.isfinite(value) and 0 < value <= 2**63 - 1 and value == int(value)
        ):
            return QuotaError(
                ErrorCode.INVALID_REQUEST, f"{name} must be a positive whole number of bytes/s"
            )
    return None


def throttle(ctx: Any, kind: str, nbytes: int) -> int:
    """Record ``nbytes`` of ``kind`` for the request's client; sets ``ctx.throttle_ms``
    (the connection mutes that long after the response) and returns it."""
    ms = ctx.broker.quotas.record(kind, user_of(ctx), ctx.header.client_id or "", nbytes)
    if ms > ctx.throttle_ms:
        ctx.throttle_ms = ms
    return int(ctx.throttle_ms)
