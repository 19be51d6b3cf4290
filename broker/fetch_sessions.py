"""KIP-227 incremental fetch sessions: the per-broker session cache and the per-request
fetch context (docs/operations.md, "Fetch sessions").

A Fetch (v7+) with epoch 0 is a *full* fetch: it names every partition; the broker answers
all of them and, if the cache has room, creates a session (a random non-zero id) holding
each partition's fetch offset, byte limit and the high watermark, last stable offset and
log start offset last sent. Each later *incremental* fetch names the session, the next
epoch, and only the partitions whose fetch position changed (plus forgotten ones); the
broker answers only partitions with records, a changed watermark or log start, or an
error. Partitions that returned records move to the end of the session's order, so large
partitions cannot starve the rest (the first partition with data may exceed the byte
limits). Epoch -1 fetches without a session (and closes the one named). An incremental
fetch does not even read the partitions this broker holds whose log has not moved since
the client was last told (``_unchanged``): a long poll waits on them too, and one that
changes rejoins the read when it wakes the poll (``refresh``).

Errors, as Kafka's: an unknown session id answers FETCH_SESSION_ID_NOT_FOUND, a wrong
epoch INVALID_FETCH_SESSION_EPOCH (clients then start over with a full fetch), mixing
topic names and ids in one session FETCH_SESSION_TOPIC_ID_ERROR. Sessions live in this
broker process only and die with it.

The cache is bounded (``--max-fetch-sessions``, Kafka's
``max.incremental.fetch.session.cache.slots``, default 1000). When full, a new session
evicts, as Kafka does, first a session unused for more than ``EVICTION_MS`` (Kafka's
``min.incremental.fetch.session.eviction.ms``, 120 s); else the least valuable session
that has existed for longer than that (fewest partitions, then lowest id) if the new one
has at least as many partitions; else no session is created (session id 0: the client
keeps sending full fetches).

Client quotas (``broker/quotas.py``) meet the fetch here too: a client over its fetch
byte rate is answered with no partitions and ``throttle_time_ms`` before any data is
read; otherwise the response's record bytes are recorded against its rate.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from broker import quotas
from broker.handlers.registry import Encoded
from broker.partition import ACTIVE, PartitionLog
from protocol.errors import ErrorCode
from protocol.fetch_fast import FetchResponseData, FetchTopicData, encode_fetch_response

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
EVICTION_MS = 120_000
DEFAULT_MAX_SESSIONS = 1000
# partitions one session may hold: sessions are kept in memory, and a client could
# otherwise grow one without bound by naming made-up partitions (Kafka has no such cap;
# a larger fetch is served, sessionless)
MAX_SESSION_PARTITIONS = 100_000

_MISSING = object()
TopicKey = str | uuid.UUID  # topic name (v7-12) or topic id (v13+)
PartKey = tuple[TopicKey, int]


@dataclass(slots=True)
class CachedPartition:
    topic: TopicKey
    partition: int
    fetch_offset: int
    partition_max_bytes: int
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1


@dataclass(slots=True)
class FetchSession:
    id: int
    uses_ids: bool
    created_ms: float
    last_used_ms: float
    epoch: int = 1  # the epoch the next incremental fetch must carry
    partitions: dict[PartKey, CachedPartition] = field(default_factory=dict)
    evictable: bool = False  # old enough to be evicted by a more valuable session


class FetchSessionCache:
    """The broker's fetch sessions, bounded by ``max_sessions`` with Kafka's eviction."""

    def __init__(
        self,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        eviction_ms: float = EVICTION_MS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_sessions = max_sessions
        self.eviction_ms = eviction_ms
        self._clock = clock
        self.sessions: dict[int, FetchSession] = {}
        self.evictions = 0

    def now_ms(self) -> float:
        return self._clock() * 1000.0

    def touch(self, session: FetchSession, now: float) -> None:
        session.last_used_ms = now
        session.evictable = now - session.created_ms > self.eviction_ms

    def remove(self, session_id: int) -> FetchSession | None:
        return self.sessions.pop(session_id, None)

    def _try_evict(self, size: int, now: float) -> bool:
        if not self.sessions:
            return False
        stale = min(self.sessions.values(), key=lambda s: s.last_used_ms)
        if now - stale.last_used_ms > self.eviction_ms:
            del self.sessions[stale.id]
            self.evictions += 1
            return True
        candidates = [s for s in self.sessions.values() if s.evictable]
        if not candidates:
            return False
        least = min(candidates, key=lambda s: (len(s.partitions), s.id))
        if size < len(least.partitions):
            return False
        del self.sessions[least.id]
        self.evictions += 1
        return True

    def create(self, partitions: dict[PartKey, CachedPartition], uses_ids: bool) -> int:
        """A new session holding ``partitions``; its id, or 0 when there is no room."""
        if self.max_sessions <= 0 or len(partitions) > MAX_SESSION_PARTITIONS:
            return INVALID_SESSION_ID
        now = self.now_ms()
        if len(self.sessions) >= self.max_sessions and not self._try_evict(len(partitions), now):
            return INVALID_SESSION_ID
        session_id = 0
        while session_id == 0 or session_id in self.sessions:
            session_id = secrets.randbits(31)
        session = FetchSession(session_id, uses_ids, now, now, partitions=partitions)
        self.touch(session, now)
        self.sessions[session_id] = session
        return session_id


# ------------------------------------------------------------------ the request view


@dataclass(slots=True)
class _PartView:
    partition: int
    fetch_offset: int
    partition_max_bytes: int


@dataclass(slots=True)
class _TopicView:
    topic: str
    topic_id: uuid.UUID
    partitions: list[_PartView]


@dataclass(slots=True)
class _RequestView:
    """What ``broker/handlers/fetch.py`` reads of a request: ``topics`` to fetch."""

    topics: list[Any]


def _key(t: Any, uses_ids: bool) -> TopicKey:
    return t.topic_id if uses_ids else t.topic


def _requested(request: Any, uses_ids: bool) -> dict[PartKey, CachedPartition]:
    out = {}
    for t in request.topics:
        k = _key(t, uses_ids)
        for p in t.partitions:
            out[(k, p.partition)] = CachedPartition(
                k, p.partition, p.fetch_offset, p.partition_max_bytes
            )
    return out


def _view(parts: list[CachedPartition], uses_ids: bool) -> _RequestView:
    topics: dict[TopicKey, _TopicView] = {}
    zero = uuid.UUID(int=0)
    for cp in parts:
        tv = topics.get(cp.topic)
        if tv is None:
            tid = cp.topic if isinstance(cp.topic, uuid.UUID) else zero
            name = "" if isinstance(cp.topic, uuid.UUID) else cp.topic
            tv = topics[cp.topic] = _TopicView(name, tid, [])
        tv.partitions.append(_PartView(cp.partition, cp.fetch_offset, cp.partition_max_bytes))
    return _RequestView(list(topics.values()))


class FetchContext:
    """One Fetch request's session handling: the partitions to read (``request``) and
    the response to send (``respond``); ``early`` is set when the request is answered
    without reading (a session error, or a client throttled by its quota)."""

    def __init__(self, ctx: Any, request: Any, version: int) -> None:
        self._ctx = ctx
        self._version = version
        self.request: Any = request
        self.early: Any = None
        self._session: FetchSession | None = None
        self._full = False
        self._idle: dict[PartKey, PartitionLog] = {}  # unchanged partitions, not read
        self._infos: dict[TopicKey, Any] = {}  # topic lookups of this request
        cache: FetchSessionCache = ctx.broker.fetch_sessions
        self._cache = cache
        uses_ids = version >= 13
        self._uses_ids = uses_ids
        session_id = getattr(request, "session_id", 0) if version >= 7 else 0
        epoch = getattr(request, "session_epoch", FINAL_EPOCH) if version >= 7 else FINAL_EPOCH
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if session_id != INVALID_SESSION_ID:
                cache.remove(session_id)  # a full fetch closes the session it names
            self._full = epoch == INITIAL_EPOCH
        else:
            self._incremental(session_id, epoch)
        if self.early is None:
            delay = ctx.broker.quotas.current_throttle(
                quotas.FETCH, quotas.user_of(ctx), ctx.header.client_id or ""
            )
            if delay > 0:
                ctx.throttle_ms = delay
                sid = self._session.id if self._session is not None else INVALID_SESSION_ID
                self.early = self._encode(FetchResponseData(throttle_time_ms=delay, session_id=sid))

    def _incremental(self, session_id: int, epoch: int) -> None:
        session = self._cache.sessions.get(session_id)
        if session is None:
            self.early = self._error(ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
            return
        if session.epoch != epoch:
            self.early = self._error(ErrorCode.INVALID_FETCH_SESSION_EPOCH)
            return
        if session.uses_ids != self._uses_ids:
            self.early = self._error(ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR)
            return
        parts = session.partitions
        for k, cp in _requested(self.request, self._uses_ids).items():
            old = parts.get(k)
            if old is None:
                parts[k] = cp
            else:
                old.fetch_offset = cp.fetch_offset
                old.partition_max_bytes = cp.partition_max_bytes
        for t in getattr(self.request, "forgotten_topics_data", None) or ():
            topic = _key(t, self._uses_ids)
            for p in t.partitions:
                parts.pop((topic, p), None)
        if not parts or len(parts) > MAX_SESSION_PARTITIONS:
            # nothing left, or more than a session may hold: the session ends and this
            # fetch is sessionless (session id 0 tells the client to start over)
            self._cache.remove(session.id)
            return
        self._cache.touch(session, self._cache.now_ms())
        session.epoch = 1 if session.epoch >= 2**31 - 1 else session.epoch + 1
        self._session = session
        self._idle = {k: lg for k, cp in parts.items() if (lg := self._unchanged(cp)) is not None}
        self.request = _view([cp for k, cp in parts.items() if k not in self._idle], self._uses_ids)

    def _unchanged(self, cp: CachedPartition) -> PartitionLog | None:
        """The partition's log when this broker holds it and nothing the client was last
        told has changed (no records past its position, same watermarks and log start):
        such a partition is left out of the read, and only waited on."""
        hw = cp.high_watermark
        if hw < 0 or cp.fetch_offset != hw or cp.last_stable_offset != hw:
            return None
        info = self._infos.get(cp.topic, _MISSING)
        if info is _MISSING:
            topics = self._ctx.broker.topics
            t = cp.topic
            info = self._infos[t] = (
                topics.get_by_id(t) if isinstance(t, uuid.UUID) else topics.get(t)
            )
        if info is None:
            return None
        lg = self._ctx.broker.logs.logs.get((info.name, cp.partition))
        if lg is None or lg.state != ACTIVE or lg.topic_id != info.topic_id:
            return None
        if lg.hw != hw or lg.log_start != cp.log_start_offset:
            return None
        return lg

    def idle_logs(self) -> list[PartitionLog]:
        """Logs of the session's unchanged partitions: a long poll waits on them too."""
        return list(self._idle.values())

    def refresh(self) -> bool:
        """After a long poll woke up: when an unchanged partition changed, it rejoins
        the read (``request`` is rebuilt, in session order); True when the caller must
        plan the read again."""
        if self._session is None or not self._idle:
            return False
        self._infos.clear()
        parts = self._session.partitions
        moved = [k for k in self._idle if k in parts and self._unchanged(parts[k]) is None]
        if not moved:
            return False
        for k in moved:
            del self._idle[k]
        self.request = _view([cp for k, cp in parts.items() if k not in self._idle], self._uses_ids)
        return True

    def _error(self, code: ErrorCode) -> Any:
        return self._encode(FetchResponseData(error_code=int(code)))

    def _encode(self, resp: FetchResponseData) -> Any:
        return Encoded(encode_fetch_response(self._version, resp))

    def respond(self, resp: FetchResponseData) -> Any:
        """The encoded response: a full fetch creates a session (when there is room), an
        incremental one keeps only the partitions that changed; quotas add the throttle."""
        if self._session is not None:
            resp = self._changed(self._session, resp)
        elif self._full:
            parts = _requested(self.request, self._uses_ids)
            self._remember(parts, resp)
            resp = replace(resp, session_id=self._cache.create(parts, self._uses_ids))
        nbytes = sum(
            sum(b.nbytes if isinstance(b, memoryview) else len(b) for b in p.records)
            for t in resp.topics
            for p in t.partitions
        )
        throttle_ms = quotas.throttle(self._ctx, quotas.FETCH, nbytes)
        if throttle_ms:
            resp = replace(resp, throttle_time_ms=throttle_ms)
        return self._encode(resp)

    def _topic_key(self, t: FetchTopicData) -> TopicKey:
        return t.topic_id if self._uses_ids else t.name

    def _remember(self, parts: dict[PartKey, CachedPartition], resp: FetchResponseData) -> None:
        for t in resp.topics:
            k = self._topic_key(t)
            for p in t.partitions:
                cp = parts.get((k, p.index))
                if cp is not None:
                    cp.high_watermark = p.high_watermark if p.error_code == 0 else -1
                    cp.last_stable_offset = p.last_stable_offset
                    cp.log_start_offset = p.log_start_offset

    def _changed(self, session: FetchSession, resp: FetchResponseData) -> FetchResponseData:
        parts = session.partitions
        topics = []
        to_end: list[PartKey] = []
        for t in resp.topics:
            k = self._topic_key(t)
            kept = []
            for p in t.partitions:
                cp = parts.get((k, p.index))
                if cp is None:
                    continue
                has_data = bool(p.records)  # batches read (never empty buffers)
                changed = (
                    has_data
                    or p.error_code != 0
                    or cp.high_watermark != p.high_watermark
                    or cp.last_stable_offset != p.last_stable_offset
                    or cp.log_start_offset != p.log_start_offset
                )
                if not changed:
                    continue
                cp.high_watermark = p.high_watermark if p.error_code == 0 else -1
                cp.last_stable_offset = p.last_stable_offset
                cp.log_start_offset = p.log_start_offset
                kept.append(p)
                if has_data:
                    to_end.append((k, p.index))
            if kept:
                topics.append(FetchTopicData(t.name, t.topic_id, kept))
        for key in to_end:  # round robin: partitions that returned data go last
            parts[key] = parts.pop(key)
        return replace(resp, topics=topics, session_id=session.id)
