"""The classic group membership protocol as the coordinator serves it.

``Membership`` adds LeaveGroup and Heartbeat to the rebalance machinery (``rebalance.py``:
JoinGroup, SyncGroup, the join and sync barriers), which sits on the group registry
(``registry.py``: loading, persistence, unloading, session timers). ``GroupCoordinator``
extends it with offsets and group administration.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from groupcoord.rebalance import Rebalancer
from groupcoord.registry import DEAD, EMPTY, PREPARING
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)


class Membership(Rebalancer):
    """The whole classic membership protocol: LeaveGroup and Heartbeat on ``Rebalancer``."""

    # ---- LeaveGroup and Heartbeat ----

    async def leave_group(
        self, group_id: str, members: Sequence[tuple[str, str | None]]
    ) -> tuple[ErrorCode, list[ErrorCode]]:
        """Remove ``(member_id, instance_id)`` pairs; returns (group error, per member)."""
        group = await self.get_group(group_id)
        if group is None:
            return ErrorCode.NONE, [ErrorCode.UNKNOWN_MEMBER_ID] * len(members)
        if group.is_(DEAD):
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, [ErrorCode.COORDINATOR_NOT_AVAILABLE] * len(
                members
            )
        errors: list[ErrorCode] = []
        removed = False
        for member_id, instance_id in members:
            target = member_id
            if instance_id is not None:
                known = group.static_members.get(instance_id)
                if known is None:
                    errors.append(ErrorCode.UNKNOWN_MEMBER_ID)
                    continue
                if member_id and member_id != known:
                    errors.append(ErrorCode.FENCED_INSTANCE_ID)
                    continue
                target = known
            if target in group.pending_members:
                handle = group.pending_members.pop(target)
                if handle is not None:
                    handle.cancel()
                errors.append(ErrorCode.NONE)
            elif group.has(target):
                log.info("group %s: member %s leaves", group_id, target)
                self.remove_member(group, target)
                removed = True
                errors.append(ErrorCode.NONE)
            else:
                errors.append(ErrorCode.UNKNOWN_MEMBER_ID)
        if removed:
            self.after_removal(group)
        return ErrorCode.NONE, errors

    async def heartbeat(
        self, group_id: str, generation: int, member_id: str, instance_id: str | None
    ) -> ErrorCode:
        group = await self.get_group(group_id)
        error = self.check_member(group, generation, member_id, instance_id)
        if error is not None or group is None:
            return error or ErrorCode.UNKNOWN_MEMBER_ID
        member = group.members[member_id]
        if group.is_(PREPARING):
            self.schedule_heartbeat(group, member)
            return ErrorCode.REBALANCE_IN_PROGRESS
        if group.is_(EMPTY):
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        self.schedule_heartbeat(group, member)
        return ErrorCode.NONE
