"""Where the coordinator keeps its groups: loading, persisting and unloading them, the
background tasks it spawns, and each member's session timer.

``GroupRegistry`` is the base of the membership protocol (``rebalance.py`` for JoinGroup
and SyncGroup, ``membership.py`` for LeaveGroup and Heartbeat). A group is loaded from the
store on first use and cached in ``groups``; it is persisted with compare-and-set on the
store revision, and a conflict (another coordinator wrote it) unloads it. A member whose
session timer fires while it is not waiting at a barrier is removed, and the group is
handed to ``after_removal`` (which the rebalance layer implements).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from groupcoord.group import Group, Member
from groupcoord.model import (
    GroupConfig,
    GroupConflictError,
    GroupState,
    GroupStore,
    JoinResult,
    SyncResult,
)
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)

EMPTY = GroupState.EMPTY
PREPARING = GroupState.PREPARING_REBALANCE
COMPLETING = GroupState.COMPLETING_REBALANCE
STABLE = GroupState.STABLE
DEAD = GroupState.DEAD


def wall_ms() -> int:
    return int(time.time() * 1000)


class GroupRegistry:
    """The loaded groups of one coordinator, their persistence and member sessions."""

    def __init__(
        self,
        store: GroupStore,
        config: GroupConfig | None = None,
        *,
        owns_group: Callable[[str], bool] | None = None,
        clock_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self.store = store
        self.config = config or GroupConfig()
        self.owns_group = owns_group or (lambda _g: True)
        self.now_ms = clock_ms
        self.groups: dict[str, Group] = {}
        self._load_locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    # ---- loading, persistence, unloading ----

    async def get_group(self, group_id: str, create: bool = False) -> Group | None:
        group = self.groups.get(group_id)
        if group is not None:
            return group
        lock = self._load_locks.setdefault(group_id, asyncio.Lock())
        async with lock:
            group = self.groups.get(group_id)
            if group is None:
                stored = await self.store.load_group(group_id)
                if stored is not None:
                    group = Group.from_record(group_id, stored.record, stored.revision)
                    for member in group.members.values():
                        self.schedule_heartbeat(group, member)
                    log.info(
                        "loaded group %s generation %s (%s members)",
                        group_id,
                        group.generation,
                        len(group.members),
                    )
                elif create:
                    group = Group(group_id, self.now_ms())
                if group is not None:
                    self.groups[group_id] = group
        self._load_locks.pop(group_id, None)
        return group

    async def persist(self, group: Group) -> None:
        """Write the group's state with CAS; a conflict unloads it and re-raises."""
        async with group.persist_lock:
            if group.is_(DEAD):
                return
            try:
                group.revision = await self.store.save_group(
                    group.group_id, group.to_record(), group.revision
                )
            except GroupConflictError:
                log.warning(
                    "group %s was written by another coordinator; unloading", group.group_id
                )
                self.unload(group.group_id)
                raise

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("group background task failed: %r", task.exception())

    async def persist_quietly(self, group: Group) -> None:
        try:
            await self.persist(group)
        except Exception as exc:  # noqa: BLE001 - logged; members rejoin on the next error
            log.warning("persisting group %s failed: %r", group.group_id, exc)

    def unload(self, group_id: str, error: ErrorCode = ErrorCode.NOT_COORDINATOR) -> None:
        """Forget a group (ownership moved or shutdown): answer its waiters with ``error``."""
        group = self.groups.pop(group_id, None)
        if group is None:
            return
        self.cancel_timers(group)
        for member in group.members.values():
            member.cancel_heartbeat()
            member.complete_join(JoinResult(error, member_id=member.member_id))
            member.complete_sync(SyncResult(error))

    def drop_unowned(self) -> None:
        """Unload every group ``owns_group`` no longer names this coordinator for (call it
        when cluster membership changes; the new owner reloads them from the store)."""
        for group_id in [g for g in self.groups if not self.owns_group(g)]:
            log.info("group %s moved to another coordinator; unloading", group_id)
            self.unload(group_id)

    def unload_all(self) -> None:
        for group_id in list(self.groups):
            self.unload(group_id)

    async def cancel_tasks(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @staticmethod
    def cancel_timers(group: Group) -> None:
        for handle in (group.join_handle, group.sync_handle, *group.pending_members.values()):
            if handle is not None:
                handle.cancel()
        group.join_handle = group.sync_handle = None

    # ---- member sessions ----

    def remove_member(self, group: Group, member_id: str) -> None:
        member = group.remove(member_id)
        if member is not None:
            member.complete_join(JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=member_id))
            member.complete_sync(SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))

    def schedule_heartbeat(self, group: Group, member: Member) -> None:
        member.cancel_heartbeat()
        member.heartbeat_handle = asyncio.get_running_loop().call_later(
            member.session_timeout_ms / 1000, self._on_session_expired, group, member.member_id
        )

    def _on_session_expired(self, group: Group, member_id: str) -> None:
        member = group.members.get(member_id)
        if member is None or self.groups.get(group.group_id) is not group:
            return
        member.heartbeat_handle = None
        if member.awaiting_join or member.awaiting_sync:
            self.schedule_heartbeat(group, member)  # barriers have their own timeouts
            return
        log.info("group %s: member %s session expired", group.group_id, member_id)
        self.remove_member(group, member_id)
        self.after_removal(group)

    def after_removal(self, group: Group) -> None:
        """Members were removed from ``group``: rebalance it (see ``Rebalancer``)."""
        raise NotImplementedError

    # ---- checks shared by SyncGroup and Heartbeat ----

    def check_member(
        self, group: Group | None, generation: int, member_id: str, instance_id: str | None
    ) -> ErrorCode | None:
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if group.is_(DEAD):
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if group.is_static_fenced(member_id, instance_id):
            return ErrorCode.FENCED_INSTANCE_ID
        if not group.has(member_id):
            return ErrorCode.UNKNOWN_MEMBER_ID
        return None
