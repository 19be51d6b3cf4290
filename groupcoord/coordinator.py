"""The group coordinator: membership (``membership.py``) plus offsets and group admin.

``GroupCoordinator(store, config, owns_group=...)`` is what the broker holds as
``broker.groups``; handlers call its coroutines with plain values and map the results onto
Kafka responses. Offsets are read from and written to the store on every request (one
store transaction per OffsetCommit), so a restarted or new coordinator sees them at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from groupcoord.consumer_coordinator import ConsumerGroupCoordinator
from groupcoord.consumer_group import TopicView
from groupcoord.consumer_model import ConsumerGroupConfig
from groupcoord.group import Group
from groupcoord.membership import Membership
from groupcoord.model import (
    MAX_OFFSET_METADATA_CHARS,
    GroupConflictError,
    GroupDescription,
    GroupListing,
    MemberDescription,
    OffsetCommit,
    OffsetDeleteResult,
    OffsetRecord,
    TopicPartition,
)
from groupcoord.registry import COMPLETING, DEAD, EMPTY, PREPARING, wall_ms
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)


class GroupCoordinator(Membership):
    """Classic groups; KIP-848 consumer groups through ``consumer`` (None unless the
    broker passes its topics: ``consumer_topics``)."""

    _stopping: asyncio.Event | None = None
    _expiry_task: asyncio.Task[None] | None = None

    def __init__(
        self,
        store: Any,
        config: Any = None,
        *,
        owns_group: Callable[[str], bool] | None = None,
        clock_ms: Callable[[], int] = wall_ms,
        consumer_topics: TopicView | None = None,
        consumer_config: ConsumerGroupConfig | None = None,
    ) -> None:
        super().__init__(store, config, owns_group=owns_group, clock_ms=clock_ms)
        self.consumer: ConsumerGroupCoordinator | None = None
        if consumer_topics is not None:
            self.consumer = ConsumerGroupCoordinator(
                store,
                self,
                consumer_topics,
                consumer_config,
                owns_group=owns_group,
                clock_ms=clock_ms,
            )

    # ---- what the consumer-group coordinator asks of the classic one ----

    async def classic_member_count(self, group_id: str) -> int | None:
        group = await self.get_group(group_id)
        if group is None or group.is_(DEAD):
            return None
        busy = group.is_(PREPARING) or group.is_(COMPLETING)
        return max(len(group.members), 1 if busy else 0)

    def forget_classic(self, group_id: str) -> None:
        group = self.groups.get(group_id)
        if group is not None:
            group.state = DEAD
        self.unload(group_id)

    async def is_consumer_group(self, group_id: str) -> bool:
        return self.consumer is not None and await self.consumer.exists(group_id)

    def drop_unowned(self) -> None:
        super().drop_unowned()
        if self.consumer is not None:
            self.consumer.drop_unowned()

    async def start(self) -> None:
        self._stopping = asyncio.Event()
        self._expiry_task = asyncio.get_running_loop().create_task(self._expiry_loop())

    async def stop(self) -> None:
        if self._stopping is not None:
            self._stopping.set()
        if self._expiry_task is not None:
            self._expiry_task.cancel()
            await asyncio.gather(self._expiry_task, return_exceptions=True)
            self._expiry_task = None
        self.unload_all()
        await self.cancel_tasks()
        if self.consumer is not None:
            await self.consumer.stop()

    async def _expiry_loop(self) -> None:
        assert self._stopping is not None
        interval = self.config.offsets_retention_check_interval_ms / 1000
        while not self._stopping.is_set():
            try:
                async with asyncio.timeout(interval):
                    await self._stopping.wait()
                return
            except TimeoutError:
                pass
            try:
                await self.expire_offsets()
            except Exception as exc:  # noqa: BLE001 - try again next interval
                log.warning("offset expiry failed: %r", exc)

    # ---- offsets ----

    async def commit_offsets(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        instance_id: str | None,
        commits: Sequence[OffsetCommit],
    ) -> dict[TopicPartition, ErrorCode]:
        """Commit in one store transaction; the error for each partition (NONE if stored)."""
        if await self.is_consumer_group(group_id):
            assert self.consumer is not None
            refused = await self.consumer.offset_member_error(group_id, member_id, generation)
            error = refused[0] if refused is not None else ErrorCode.NONE
        else:
            error = await self._commit_check(group_id, generation, member_id, instance_id)
        if error is not ErrorCode.NONE:
            return {c.tp: error for c in commits}
        result: dict[TopicPartition, ErrorCode] = {}
        now = self.now_ms()
        rows: list[tuple[TopicPartition, OffsetRecord]] = []
        for c in commits:
            if c.metadata is not None and len(c.metadata) > MAX_OFFSET_METADATA_CHARS:
                result[c.tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            else:
                rows.append((c.tp, OffsetRecord(c.offset, c.leader_epoch, c.metadata, now)))
                result[c.tp] = ErrorCode.NONE
        if rows:
            try:
                await self.store.commit_offsets(group_id, rows)
            except Exception as exc:  # noqa: BLE001 - the client retries a retriable error
                log.warning("group %s: offset commit failed: %r", group_id, exc)
                for tp, _ in rows:
                    result[tp] = ErrorCode.COORDINATOR_NOT_AVAILABLE
        return result

    async def _commit_check(
        self, group_id: str, generation: int, member_id: str, instance_id: str | None
    ) -> ErrorCode:
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID
        # a standalone ("simple") consumer commits with generation -1: as Kafka does, its
        # group then exists (Empty, no protocol type) and later commits need no lookup
        group = await self.get_group(group_id, create=generation < 0)
        if group is None:
            return ErrorCode.ILLEGAL_GENERATION
        if group.is_(DEAD):
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if group.is_static_fenced(member_id, instance_id):
            return ErrorCode.FENCED_INSTANCE_ID
        if generation < 0 and group.is_(EMPTY):
            return ErrorCode.NONE
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        if group.is_(COMPLETING):
            return ErrorCode.REBALANCE_IN_PROGRESS
        self.schedule_heartbeat(group, member)
        return ErrorCode.NONE

    async def check_txn_member(
        self, group_id: str, generation: int, member_id: str, instance_id: str | None
    ) -> ErrorCode:
        """TxnOffsetCommit v3+ (KIP-447): offsets sent with a consumer's member id and
        generation are taken only while that member is current, which fences a zombie
        instance after a rebalance. Without them (generation -1, no member id) nothing is
        checked, as in Kafka."""
        if generation < 0 and not member_id:
            return ErrorCode.NONE
        group = await self.get_group(group_id)
        if group is None:
            return ErrorCode.ILLEGAL_GENERATION
        if group.is_(DEAD):
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if group.is_static_fenced(member_id, instance_id):
            return ErrorCode.FENCED_INSTANCE_ID
        if member_id and member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation >= 0 and generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

    async def fetch_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> tuple[ErrorCode, dict[TopicPartition, OffsetRecord]]:
        """Committed offsets of the group (all of them when ``partitions`` is None)."""
        try:
            offsets = await self.store.fetch_offsets(group_id)
        except Exception as exc:  # noqa: BLE001
            log.warning("group %s: offset fetch failed: %r", group_id, exc)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, {}
        if partitions is not None:
            wanted = set(partitions)
            offsets = {tp: rec for tp, rec in offsets.items() if tp in wanted}
        return ErrorCode.NONE, offsets

    async def delete_offsets(
        self, group_id: str, partitions: Sequence[TopicPartition]
    ) -> OffsetDeleteResult:
        if self.consumer is not None and await self.consumer.exists(group_id):
            subscribed = await self.consumer.subscribed_topic_names(group_id)
        else:
            group = await self.get_group(group_id)
            if group is None:
                if not await self.store.fetch_offsets(group_id):
                    return OffsetDeleteResult(ErrorCode.GROUP_ID_NOT_FOUND)
            elif group.is_(DEAD):
                return OffsetDeleteResult(ErrorCode.GROUP_ID_NOT_FOUND)
            elif group.members and group.protocol_type != "consumer":
                return OffsetDeleteResult(ErrorCode.NON_EMPTY_GROUP)
            subscribed = group.subscribed_topics() if group is not None else set()
        errors = {
            tp: ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC if tp.topic in subscribed else ErrorCode.NONE
            for tp in partitions
        }
        await self.store.delete_offsets(
            group_id, [tp for tp, e in errors.items() if e is ErrorCode.NONE]
        )
        return OffsetDeleteResult(ErrorCode.NONE, errors)

    # ---- admin ----

    async def describe_group(self, group_id: str) -> GroupDescription:
        group = await self.get_group(group_id)
        if group is None:
            state = "Empty" if await self.store.fetch_offsets(group_id) else "Dead"
            return GroupDescription(group_id, ErrorCode.NONE, state)
        stable = group.state.value == "Stable"
        members = tuple(
            MemberDescription(
                m.member_id,
                m.instance_id,
                m.client_id,
                m.client_host,
                m.metadata_for(group.protocol_name) if stable else b"",
                m.assignment if stable else b"",
            )
            for m in group.members.values()
        )
        return GroupDescription(
            group_id,
            ErrorCode.NONE,
            group.state.value,
            group.protocol_type,
            (group.protocol_name or "") if stable else "",
            members,
        )

    async def list_groups(self, states: Iterable[str] | None = None) -> list[GroupListing]:
        """Groups this coordinator owns, optionally only those in ``states`` (any case)."""
        wanted = {s.lower() for s in states} if states else None
        ids = set(await self.store.list_groups()) | set(self.groups)
        listings = []
        for group_id in sorted(ids):
            if not self.owns_group(group_id):
                continue
            if self.consumer is not None:
                consumer = await self.consumer.list_groups([group_id])
                if consumer:
                    listing = GroupListing(group_id, "consumer", consumer[0][1], "consumer")
                    if wanted is None or listing.state.lower() in wanted:
                        listings.append(listing)
                    continue
            group = await self.get_group(group_id)
            if group is not None and group.is_(DEAD):
                continue
            listing = (
                GroupListing(group_id, group.protocol_type, group.state.value)
                if group is not None
                else GroupListing(group_id, "", "Empty")
            )
            if wanted is None or listing.state.lower() in wanted:
                listings.append(listing)
        return listings

    async def delete_groups(self, group_ids: Sequence[str]) -> dict[str, ErrorCode]:
        return {g: await self._delete_group(g) for g in group_ids}

    async def _delete_group(self, group_id: str) -> ErrorCode:
        if await self.is_consumer_group(group_id):
            assert self.consumer is not None
            return await self.consumer.delete(group_id)
        group = await self.get_group(group_id)
        revision = 0
        if group is None:
            if not await self.store.fetch_offsets(group_id):
                return ErrorCode.GROUP_ID_NOT_FOUND
        elif group.is_(DEAD):
            return ErrorCode.GROUP_ID_NOT_FOUND
        elif group.members or group.is_(PREPARING) or group.is_(COMPLETING):
            return ErrorCode.NON_EMPTY_GROUP
        else:
            revision = group.revision
        try:
            await self.store.delete_group(group_id, revision)
        except GroupConflictError:
            self.unload(group_id)
            return ErrorCode.NOT_COORDINATOR
        except Exception as exc:  # noqa: BLE001
            log.warning("group %s: delete failed: %r", group_id, exc)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        self._mark_dead(group_id, group)
        log.info("group %s deleted", group_id)
        return ErrorCode.NONE

    def _mark_dead(self, group_id: str, group: Group | None) -> None:
        if group is not None:
            group.state = DEAD
            self.cancel_timers(group)
        self.groups.pop(group_id, None)

    # ---- retention ----

    async def expire_offsets(self, now_ms: int | None = None) -> int:
        """Remove offsets of Empty/standalone groups older than the retention; return count.

        An offset expires once both its commit and the group's last state change (the
        moment it became Empty) are older than ``offsets_retention_minutes``; a group left
        with no offsets and no members is deleted.
        """
        now = self.now_ms() if now_ms is None else now_ms
        retention = self.config.offsets_retention_minutes * 60_000
        removed = 0
        for group_id in await self.store.list_groups():
            if not self.owns_group(group_id):
                continue
            if self.consumer is not None:
                n = await self.consumer.expire_offsets(group_id, now, retention)
                if n is not None:
                    removed += n
                    continue
            group = await self.get_group(group_id)
            if group is not None and not group.is_(EMPTY):
                continue
            offsets = await self.store.fetch_offsets(group_id)
            since = group.state_ts if group is not None else 0
            expired = [
                tp for tp, rec in offsets.items() if max(rec.commit_ts, since) + retention <= now
            ]
            if expired and len(expired) == len(offsets):
                revision = group.revision if group is not None else 0
                try:
                    await self.store.delete_group(group_id, revision)
                except GroupConflictError:
                    self.unload(group_id)
                    continue
                self._mark_dead(group_id, group)
                log.info("group %s expired (%s offsets)", group_id, len(expired))
            elif expired:
                await self.store.delete_offsets(group_id, expired)
            elif not offsets and group is not None and since + retention <= now:
                await self.store.delete_group(group_id, group.revision)
                self._mark_dead(group_id, group)
            removed += len(expired)
        return removed
