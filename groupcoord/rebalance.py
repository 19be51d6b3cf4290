"""The rebalance half of the classic group protocol: JoinGroup, SyncGroup and the barriers.

State machine (as Kafka's classic coordinator)::

    Empty --join--> PreparingRebalance --all joined / rebalance timeout--> CompletingRebalance
    CompletingRebalance --leader's SyncGroup persisted--> Stable
    Stable / CompletingRebalance --join of new or changed member, leave, expiry--> Preparing
    PreparingRebalance --no member left--> Empty;   any --DeleteGroups--> Dead

Barriers are futures completed by events (the last join, the leader's sync) or by loop
timers (rebalance timeout, session timeout, the sync timeout that removes members which
never sent SyncGroup): nothing polls. Group state is persisted with compare-and-set on the
store revision when a generation's assignment is known, when a static member is replaced,
and when the group becomes Empty.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from groupcoord.group import Group, Member
from groupcoord.model import GroupConflictError, JoinRequest, JoinResult, SyncResult
from groupcoord.registry import COMPLETING, DEAD, EMPTY, PREPARING, STABLE, GroupRegistry
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)


class Rebalancer(GroupRegistry):
    """JoinGroup and SyncGroup: the join barrier, the sync barrier and their timeouts."""

    # ---- JoinGroup ----

    async def join_group(self, req: JoinRequest) -> JoinResult:
        if not req.group_id:
            return JoinResult(ErrorCode.INVALID_GROUP_ID, member_id=req.member_id)
        cfg = self.config
        if not cfg.min_session_timeout_ms <= req.session_timeout_ms <= cfg.max_session_timeout_ms:
            return JoinResult(ErrorCode.INVALID_SESSION_TIMEOUT, member_id=req.member_id)
        if sum(len(m) for _, m in req.protocols) > cfg.max_member_metadata_bytes:
            return JoinResult(ErrorCode.INVALID_REQUEST, member_id=req.member_id)
        group = await self.get_group(req.group_id, create=req.member_id == "")
        if group is None:
            return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=req.member_id)
        if group.is_(DEAD):
            return JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id=req.member_id)
        if not group.supports(req.protocol_type, req.protocols):
            return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id=req.member_id)
        if req.member_id == "":
            return await self._join_new(group, req)
        return await self._join_known(group, req)

    async def _join_new(self, group: Group, req: JoinRequest) -> JoinResult:
        new_id = f"{req.instance_id or req.client_id}-{uuid.uuid4()}"
        if req.instance_id is not None:
            old_id = group.static_members.get(req.instance_id)
            if old_id is not None and old_id in group.members:
                return await self._replace_static(group, group.members[old_id], new_id, req)
            return await self._add_and_rebalance(group, new_id, req)
        if req.require_known_member_id:
            loop = asyncio.get_running_loop()
            group.pending_members[new_id] = loop.call_later(
                req.session_timeout_ms / 1000, self._expire_pending, group, new_id
            )
            return JoinResult(ErrorCode.MEMBER_ID_REQUIRED, member_id=new_id)
        return await self._add_and_rebalance(group, new_id, req)

    async def _join_known(self, group: Group, req: JoinRequest) -> JoinResult:
        member_id = req.member_id
        if member_id in group.pending_members:
            handle = group.pending_members.pop(member_id)
            if handle is not None:
                handle.cancel()
            return await self._add_and_rebalance(group, member_id, req)
        if group.is_static_fenced(member_id, req.instance_id):
            return JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id=member_id)
        member = group.members.get(member_id)
        if member is None or group.state in (EMPTY, DEAD):
            return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=member_id)
        if group.is_(COMPLETING) and member.matches(req.protocols):
            return group.join_result_for(member)
        if group.is_(STABLE) and not group.is_leader(member_id) and member.matches(req.protocols):
            self.schedule_heartbeat(group, member)
            return group.join_result_for(member)
        return await self._update_and_rebalance(group, member, req)

    async def _replace_static(
        self, group: Group, member: Member, new_id: str, req: JoinRequest
    ) -> JoinResult:
        old_id = member.member_id
        member.complete_join(JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id=old_id))
        member.complete_sync(SyncResult(ErrorCode.FENCED_INSTANCE_ID))
        unchanged = member.matches(req.protocols)
        group.replace_static(member, new_id)
        member.client_id, member.client_host = req.client_id, req.client_host
        log.info("group %s: static member %s rejoined as %s", group.group_id, old_id, new_id)
        if not (group.is_(STABLE) and unchanged):
            return await self._update_and_rebalance(group, member, req)
        member.session_timeout_ms = req.session_timeout_ms
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        try:
            await self.persist(group)
        except GroupConflictError:
            return JoinResult(ErrorCode.NOT_COORDINATOR, member_id=new_id)
        except Exception:  # noqa: BLE001 - store down: let the client retry
            log.warning("group %s: persisting static rejoin failed", group.group_id)
            return JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id=new_id)
        self.schedule_heartbeat(group, member)
        return group.join_result_for(member, skip_assignment=group.is_leader(new_id))

    async def _add_and_rebalance(
        self, group: Group, member_id: str, req: JoinRequest
    ) -> JoinResult:
        member = Member(
            member_id,
            req.instance_id,
            req.client_id,
            req.client_host,
            req.session_timeout_ms,
            req.rebalance_timeout_ms,
            req.protocol_type,
            req.protocols,
        )
        fut: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        member.join_future = fut
        group.add(member)
        log.info("group %s: member %s joins", group.group_id, member_id)
        self._maybe_rebalance(group)
        return await fut

    async def _update_and_rebalance(
        self, group: Group, member: Member, req: JoinRequest
    ) -> JoinResult:
        member.complete_join(
            JoinResult(ErrorCode.REBALANCE_IN_PROGRESS, member_id=member.member_id)
        )
        member.protocols = req.protocols
        member.session_timeout_ms = req.session_timeout_ms
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        fut: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        member.join_future = fut
        self._maybe_rebalance(group)
        return await fut

    def _expire_pending(self, group: Group, member_id: str) -> None:
        if member_id in group.pending_members:
            del group.pending_members[member_id]
            if group.is_(PREPARING):
                self._try_complete_join(group)

    # ---- the join barrier ----

    def _maybe_rebalance(self, group: Group) -> None:
        if group.state in (EMPTY, STABLE, COMPLETING):
            self._prepare_rebalance(group)
        elif group.is_(PREPARING):
            self._try_complete_join(group)

    def _prepare_rebalance(self, group: Group) -> None:
        loop = asyncio.get_running_loop()
        delay_ms = 0
        if group.is_(COMPLETING):
            self._reset_assignments(group, ErrorCode.REBALANCE_IN_PROGRESS)
        if group.is_(EMPTY):
            delay_ms = self.config.initial_rebalance_delay_ms
            group.join_not_before = loop.time() + delay_ms / 1000
        log.info(
            "group %s: rebalance from %s (generation %s)",
            group.group_id,
            group.state.value,
            group.generation,
        )
        group.state = PREPARING
        group.state_ts = self.now_ms()
        if group.join_handle is not None:
            group.join_handle.cancel()
        timeout_s = (group.max_rebalance_timeout_ms() + delay_ms) / 1000
        group.join_handle = loop.call_later(timeout_s, self._on_join_timeout, group)
        self._try_complete_join(group)

    def _reset_assignments(self, group: Group, error: ErrorCode) -> None:
        if group.sync_handle is not None:
            group.sync_handle.cancel()
            group.sync_handle = None
        group.pending_sync.clear()
        for member in group.members.values():
            member.assignment = b""
            member.complete_sync(SyncResult(error))

    def _try_complete_join(self, group: Group) -> None:
        if not group.is_(PREPARING) or not group.all_joined():
            return
        loop = asyncio.get_running_loop()
        wait = group.join_not_before - loop.time()
        if wait > 0 and group.members:
            loop.call_later(wait, self._try_complete_join, group)
            return
        self._complete_join(group)

    def _on_join_timeout(self, group: Group) -> None:
        group.join_handle = None
        if group.is_(PREPARING):
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        if group.join_handle is not None:
            group.join_handle.cancel()
            group.join_handle = None
        for member_id, member in list(group.members.items()):
            if not member.awaiting_join:
                log.info("group %s: member %s did not rejoin in time", group.group_id, member_id)
                self.remove_member(group, member_id)
        for handle in group.pending_members.values():
            if handle is not None:
                handle.cancel()
        group.pending_members.clear()
        group.generation += 1
        group.state_ts = self.now_ms()
        if not group.members:
            group.state = EMPTY
            group.protocol_name = None
            group.leader_id = None
            log.info("group %s: empty at generation %s", group.group_id, group.generation)
            self.spawn(self.persist_quietly(group))
            return
        group.protocol_name = group.select_protocol()
        group.state = COMPLETING
        group.pending_sync = set(group.members)
        log.info(
            "group %s: generation %s, protocol %s, leader %s, %s members",
            group.group_id,
            group.generation,
            group.protocol_name,
            group.leader_id,
            len(group.members),
        )
        for member in group.members.values():
            member.complete_join(group.join_result_for(member))
            self.schedule_heartbeat(group, member)
        group.sync_handle = asyncio.get_running_loop().call_later(
            group.max_rebalance_timeout_ms() / 1000, self._on_sync_timeout, group, group.generation
        )

    def _on_sync_timeout(self, group: Group, generation: int) -> None:
        group.sync_handle = None
        if not group.is_(COMPLETING) or group.generation != generation:
            return
        for member_id in list(group.pending_sync):
            log.info("group %s: member %s never sent SyncGroup", group.group_id, member_id)
            self.remove_member(group, member_id)
        self._prepare_rebalance(group)

    def after_removal(self, group: Group) -> None:
        if group.state in (STABLE, COMPLETING):
            self._prepare_rebalance(group)
        elif group.is_(PREPARING):
            self._try_complete_join(group)

    # ---- SyncGroup ----

    async def sync_group(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        instance_id: str | None,
        assignments: dict[str, bytes],
        protocol_type: str | None = None,
        protocol_name: str | None = None,
    ) -> SyncResult:
        group = await self.get_group(group_id)
        error = self.check_member(group, generation, member_id, instance_id)
        if error is not None or group is None:
            return SyncResult(error or ErrorCode.UNKNOWN_MEMBER_ID)
        if generation != group.generation:
            return SyncResult(ErrorCode.ILLEGAL_GENERATION)
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
            protocol_name is not None and protocol_name != group.protocol_name
        ):
            return SyncResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        member = group.members[member_id]
        if group.is_(PREPARING):
            return SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)
        self.schedule_heartbeat(group, member)
        if group.is_(STABLE):
            return SyncResult(
                ErrorCode.NONE, group.protocol_type, group.protocol_name, member.assignment
            )
        member.complete_sync(SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
        fut: asyncio.Future[SyncResult] = asyncio.get_running_loop().create_future()
        member.sync_future = fut
        group.pending_sync.discard(member_id)
        if group.is_leader(member_id):
            await self._finish_sync(group, generation, assignments)
        return await fut

    async def _finish_sync(
        self, group: Group, generation: int, assignments: dict[str, bytes]
    ) -> None:
        for member in group.members.values():
            member.assignment = assignments.get(member.member_id, b"")
        try:
            await self.persist(group)
        except Exception as exc:  # noqa: BLE001 - conflict or store failure
            error = (
                ErrorCode.NOT_COORDINATOR
                if isinstance(exc, GroupConflictError)
                else ErrorCode.COORDINATOR_NOT_AVAILABLE
            )
            log.warning("group %s: storing assignment failed: %r", group.group_id, exc)
            if group.is_(COMPLETING) and group.generation == generation:
                self._reset_assignments(group, error)
                self._prepare_rebalance(group)
            return
        if group.is_(COMPLETING) and group.generation == generation:
            if group.sync_handle is not None:
                group.sync_handle.cancel()
                group.sync_handle = None
            group.state = STABLE
            group.state_ts = self.now_ms()
            log.info("group %s: stable at generation %s", group.group_id, generation)
            for member in group.members.values():
                member.complete_sync(
                    SyncResult(
                        ErrorCode.NONE, group.protocol_type, group.protocol_name, member.assignment
                    )
                )
