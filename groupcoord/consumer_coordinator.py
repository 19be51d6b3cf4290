"""The KIP-848 consumer-group coordinator: loads, persists and times consumer groups.

``ConsumerGroupCoordinator`` sits beside the classic coordinator (which holds it as
``GroupCoordinator.consumer``). Each group is loaded from the store on first use, changed
under its own lock by ``consumer_group.heartbeat`` and written back with compare-and-set
before the heartbeat is answered; a conflict or a store error unloads it (the in-memory
change is dropped, the member retries). A member's session timer restarts with each
heartbeat and removes it when it fires; a member asked to revoke partitions must do so
within its rebalance timeout or it is removed. Conversions to and from classic groups
happen only for groups without members (docs/compatibility.md, KIP-848 consumer groups).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from groupcoord.consumer_group import (
    HeartbeatError,
    HeartbeatRequest,
    HeartbeatResult,
    TopicView,
    heartbeat,
    remove_member,
    stale_member_error,
    subscribed_metadata,
    validate,
)
from groupcoord.consumer_model import (
    JOIN_EPOCH,
    ConsumerGroupConfig,
    ConsumerGroupState,
    MemberState,
)
from groupcoord.model import GroupConflictError, OffsetRecord, TopicPartition
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)


class ConsumerGroupStore(Protocol):
    """``broker.group_store.MetaGroupStore`` provides these."""

    async def load_consumer_group(self, group_id: str) -> tuple[bytes, int] | None: ...
    async def load_classic_revision(self, group_id: str) -> int: ...
    async def save_consumer_group(
        self, group_id: str, value: bytes, expected_revision: int, classic_revision: int = 0
    ) -> int: ...
    async def delete_consumer_group(
        self, group_id: str, expected_revision: int, with_offsets: bool
    ) -> None: ...
    async def fetch_offsets(self, group_id: str) -> dict[TopicPartition, OffsetRecord]: ...
    async def delete_offsets(self, group_id: str, partitions: Sequence[TopicPartition]) -> None: ...


class ClassicGroups(Protocol):
    """What the consumer coordinator needs of the classic one (conversions)."""

    async def classic_member_count(self, group_id: str) -> int | None:
        """None: no classic group; else its number of members (and rebalancing ones)."""
        ...

    def forget_classic(self, group_id: str) -> None: ...


@dataclass(slots=True)
class LoadedGroup:
    state: ConsumerGroupState
    revision: int
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    sessions: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    revocations: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    version: int = 0  # in-memory changes applied so far
    durable: int = 0  # changes written to the store so far
    flushing: asyncio.Future[None] | None = None  # the write in flight

    def cancel(self, member_id: str) -> None:
        for timers in (self.sessions, self.revocations):
            handle = timers.pop(member_id, None)
            if handle is not None:
                handle.cancel()

    def cancel_all(self) -> None:
        for member_id in list(self.sessions) + list(self.revocations):
            self.cancel(member_id)


def _moved() -> HeartbeatResult:
    return HeartbeatResult(ErrorCode.NOT_COORDINATOR, "The group changed on another coordinator.")


def _wall_ms() -> int:
    return int(time.time() * 1000)


class ConsumerGroupCoordinator:
    def __init__(
        self,
        store: ConsumerGroupStore,
        classic: ClassicGroups,
        topics: TopicView,
        config: ConsumerGroupConfig | None = None,
        *,
        owns_group: Callable[[str], bool] | None = None,
        clock_ms: Callable[[], int] = _wall_ms,
    ) -> None:
        self.store = store
        self.classic = classic
        self.topics = topics
        self.config = config or ConsumerGroupConfig()
        self.owns_group = owns_group or (lambda _g: True)
        self.now_ms = clock_ms
        self.groups: dict[str, LoadedGroup] = {}
        self._absent: set[str] = set()  # looked up and not found (all writes come here)
        self._load_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    # ---- loading and persistence ----

    async def load(self, group_id: str) -> LoadedGroup | None:
        group = self.groups.get(group_id)
        if group is not None or group_id in self._absent:
            return group
        async with self._load_lock:
            group = self.groups.get(group_id)
            if group is None:
                stored = await self.store.load_consumer_group(group_id)
                if stored is None:
                    self._absent.add(group_id)
                    return None
                state = ConsumerGroupState.from_json(group_id, stored[0])
                group = LoadedGroup(state, stored[1])
                self.groups[group_id] = group
                for member_id in state.members:
                    self._schedule_session(group, member_id)
                log.info(
                    "loaded consumer group %s epoch %d (%d members)",
                    group_id,
                    state.epoch,
                    len(state.members),
                )
        return group

    async def exists(self, group_id: str) -> bool:
        return await self.load(group_id) is not None

    async def _persist(self, group: LoadedGroup, classic_revision: int = 0) -> None:
        """Write the group (CAS) now; on any failure unload it and re-raise."""
        version = group.version
        try:
            group.revision = await self.store.save_consumer_group(
                group.state.group_id, group.state.to_json(), group.revision, classic_revision
            )
        except BaseException:
            self.unload(group.state.group_id)
            raise
        group.durable = max(group.durable, version)

    async def _durable(self, group: LoadedGroup, version: int) -> None:
        """Return once the group's changes up to ``version`` are in the store. Changes of
        heartbeats arriving while a write is in flight share the next write (one write
        per round trip, not per heartbeat); a failed write unloads the group and raises
        for every waiter (their answers never rest on an unwritten change)."""
        while group.durable < version:
            if self.groups.get(group.state.group_id) is not group:
                raise GroupConflictError(f"consumer group {group.state.group_id!r} unloaded")
            if group.flushing is not None:
                await asyncio.shield(group.flushing)
                continue
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())
            group.flushing = fut
            try:
                await self._persist(group)
            except BaseException as exc:
                fut.set_exception(exc)
                raise
            else:
                fut.set_result(None)
            finally:
                group.flushing = None

    def unload(self, group_id: str) -> None:
        group = self.groups.pop(group_id, None)
        if group is not None:
            group.cancel_all()

    def unload_all(self) -> None:
        for group_id in list(self.groups):
            self.unload(group_id)

    def drop_unowned(self) -> None:
        self._absent.clear()
        for group_id in [g for g in self.groups if not self.owns_group(g)]:
            log.info("consumer group %s moved to another coordinator; unloading", group_id)
            self.unload(group_id)

    async def stop(self) -> None:
        self.unload_all()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---- ConsumerGroupHeartbeat ----

    async def heartbeat(self, req: HeartbeatRequest) -> HeartbeatResult:
        try:
            validate(req, self.config)
        except HeartbeatError as exc:
            return HeartbeatResult(exc.code, exc.message)
        group = await self.load(req.group_id)
        classic_revision = 0
        if group is None:
            if req.epoch != JOIN_EPOCH:
                return HeartbeatResult(
                    ErrorCode.UNKNOWN_MEMBER_ID if req.epoch > 0 else ErrorCode.GROUP_ID_NOT_FOUND,
                    f"Consumer group {req.group_id} not found.",
                )
            refusal = await self._upgrade_refusal(req.group_id)
            if refusal is not None:
                return refusal
            classic_revision = await self.store.load_classic_revision(req.group_id)
            self._absent.discard(req.group_id)
            group = self.groups.setdefault(
                req.group_id, LoadedGroup(ConsumerGroupState(req.group_id), 0)
            )
        async with group.lock:
            if self.groups.get(req.group_id) is not group:
                return HeartbeatResult(
                    ErrorCode.COORDINATOR_NOT_AVAILABLE, "The group was unloaded; retry."
                )
            if group.revision != 0:
                classic_revision = 0  # created meanwhile by a concurrent join
            result = heartbeat(group.state, req, self.topics, self.config, self.now_ms())
            if result.error is not ErrorCode.NONE:
                if group.revision == 0 and not group.state.members:
                    self.unload(req.group_id)  # a refused first join creates nothing
                return result
            if result.changed:
                group.version += 1
            first = group.revision == 0
            if first:  # creation (or conversion): written before anyone else may join
                try:
                    await self._persist(group, classic_revision)
                except GroupConflictError:
                    return _moved()
                if classic_revision:
                    self.classic.forget_classic(req.group_id)
                    log.info("classic group %s converted to a consumer group", req.group_id)
            for member_id in [m for m in group.sessions if m not in group.state.members]:
                group.cancel(member_id)  # left, or replaced by a static member's new id
            if result.member_id in group.state.members:
                self._after_heartbeat(group, result.member_id)
            version = group.version
        try:
            await self._durable(group, version)
        except GroupConflictError:
            return _moved()
        return result

    async def _upgrade_refusal(self, group_id: str) -> HeartbeatResult | None:
        members = await self.classic.classic_member_count(group_id)
        if members is None or members == 0:
            return None  # a new group, or an empty classic one (converted, offsets kept)
        policy = self.config.migration_policy.value
        return HeartbeatResult(
            ErrorCode.GROUP_ID_NOT_FOUND,
            f"Group {group_id} is not a consumer group: it is a classic group with "
            f"{members} member(s). This broker converts a classic group only once it has "
            f"no members (group.consumer.migration.policy={policy}).",
        )

    def _after_heartbeat(self, group: LoadedGroup, member_id: str) -> None:
        self._schedule_session(group, member_id)
        member = group.state.members[member_id]
        pending = group.revocations.get(member_id)
        if member.state is MemberState.UNREVOKED_PARTITIONS:
            if pending is None:
                group.revocations[member_id] = asyncio.get_running_loop().call_later(
                    member.rebalance_timeout_ms / 1000,
                    self._expire,
                    group,
                    member_id,
                    member.epoch,
                    "did not revoke its partitions within its rebalance timeout",
                )
        elif pending is not None:
            pending.cancel()
            del group.revocations[member_id]

    def _schedule_session(self, group: LoadedGroup, member_id: str) -> None:
        old = group.sessions.pop(member_id, None)
        if old is not None:
            old.cancel()
        group.sessions[member_id] = asyncio.get_running_loop().call_later(
            self.config.session_timeout_ms / 1000,
            self._expire,
            group,
            member_id,
            None,
            "session timed out",
        )

    def _expire(self, group: LoadedGroup, member_id: str, epoch: int | None, why: str) -> None:
        task = asyncio.get_running_loop().create_task(
            self._remove_expired(group, member_id, epoch, why)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _remove_expired(
        self, group: LoadedGroup, member_id: str, epoch: int | None, why: str
    ) -> None:
        async with group.lock:
            member = group.state.members.get(member_id)
            if self.groups.get(group.state.group_id) is not group or member is None:
                return
            if epoch is not None and member.epoch != epoch:
                return
            log.info("consumer group %s: member %s %s", group.state.group_id, member_id, why)
            group.cancel(member_id)
            remove_member(group.state, member_id, self.now_ms())
            group.version += 1
            version = group.version
        try:
            await self._durable(group, version)
        except Exception as exc:  # noqa: BLE001 - unloaded; reloaded on next use
            log.warning("consumer group %s: persisting failed: %r", group.state.group_id, exc)

    # ---- offsets, admin ----

    async def offset_member_error(
        self, group_id: str, member_id: str, epoch: int
    ) -> tuple[ErrorCode, str] | None:
        """OffsetCommit v9+/OffsetFetch v9+ checks for a consumer group: a commit without
        a member (epoch < 0, admin or standalone) is allowed only while it is empty."""
        group = await self.load(group_id)
        if group is None:
            return None
        state = group.state
        if epoch < 0 and not member_id:
            if state.members:
                return ErrorCode.UNKNOWN_MEMBER_ID, "The group has members."
            return None
        return stale_member_error(state, member_id, epoch)

    async def delete(self, group_id: str) -> ErrorCode:
        group = await self.load(group_id)
        if group is None:
            return ErrorCode.GROUP_ID_NOT_FOUND
        async with group.lock:
            if group.state.members:
                return ErrorCode.NON_EMPTY_GROUP
            try:
                await self._durable(group, group.version)
                await self.store.delete_consumer_group(group_id, group.revision, True)
            except GroupConflictError:
                self.unload(group_id)
                return ErrorCode.NOT_COORDINATOR
            self.unload(group_id)
        log.info("consumer group %s deleted", group_id)
        return ErrorCode.NONE

    async def downgrade_error(self, group_id: str) -> str | None:
        """Before a classic JoinGroup: None if the group is not a consumer group or is an
        empty one (then deleted, offsets kept); else why the join is refused."""
        group = await self.load(group_id)
        if group is None:
            return None
        async with group.lock:
            if group.state.members:
                return (
                    f"group {group_id} is a consumer group (group.protocol=consumer) with "
                    f"{len(group.state.members)} member(s); a classic member can join it only "
                    "once it has none"
                )
            await self._durable(group, group.version)
            await self.store.delete_consumer_group(group_id, group.revision, False)
            self.unload(group_id)
        log.info("empty consumer group %s converted to a classic group", group_id)
        return None

    async def expire_offsets(self, group_id: str, now: int, retention_ms: int) -> int | None:
        """Offset retention for a consumer group, as for classic ones: once it has been
        Empty for ``retention_ms``, offsets committed longer ago than that are deleted,
        and the group with them when none is left. None: not a consumer group."""
        group = await self.load(group_id)
        if group is None:
            return None
        async with group.lock:
            if group.state.members or self.groups.get(group_id) is not group:
                return 0
            offsets = await self.store.fetch_offsets(group_id)
            since = group.state.state_ts
            expired = [
                tp for tp, rec in offsets.items() if max(rec.commit_ts, since) + retention_ms <= now
            ]
            if len(expired) < len(offsets):
                if expired:
                    await self.store.delete_offsets(group_id, expired)
                return len(expired)
            if since + retention_ms > now:
                return 0
            await self._durable(group, group.version)
            await self.store.delete_consumer_group(group_id, group.revision, True)
            self.unload(group_id)
        log.info("consumer group %s expired (%d offsets)", group_id, len(expired))
        return len(expired)

    async def subscribed_topic_names(self, group_id: str) -> set[str]:
        """Topics the members subscribe to, by name or regex (OffsetDelete refuses them)."""
        group = await self.load(group_id)
        if group is None:
            return set()
        ids = set(subscribed_metadata(group.state, self.topics))
        return {t.name for t in self.topics.all() if t.topic_id in ids}

    async def list_groups(self, group_ids: list[str]) -> list[tuple[str, str]]:
        """(group id, state) of each of ``group_ids`` that is a consumer group."""
        out = []
        for group_id in group_ids:
            group = await self.load(group_id)
            if group is not None:
                out.append((group_id, group.state.state_name()))
        return out
