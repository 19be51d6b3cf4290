"""``MetaGroupStore``: consumer-group state and committed offsets in the metadata store.

Keys (docs/format.md, metadata keys, relative to the store prefix; the group id is
percent-encoded so a ``/``
in it cannot break the layout)::

    /groups/{group}/state               -> GroupRecord JSON
    /groups/{group}/consumer            -> ConsumerGroupState JSON (KIP-848 groups)
    /groups/{group}/offsets/{topic}/{p} -> {offset, leader_epoch, metadata, commit_ts}

The state is written with compare-and-set on its mod_revision (0 = must not exist); a
classic state is written only while no consumer state exists and vice versa, so a group is
never both (a conversion deletes one and creates the other in one transaction). An
OffsetCommit request's offsets are written in one transaction (several only past
``meta.max_txn_ops``), and requests that arrive while one is in flight share the next
transaction (group commit), so store writes scale with round trips, not with requests.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from urllib.parse import unquote

from broker.meta.base import Compare, Delete, KeyValue, MetaStore, Op, Put
from broker.meta.schema import (
    GROUPS_PREFIX,
    TXN_PREFIX,
    consumer_group_key,
    group_offset_key,
    group_offset_topic,
    group_prefix,
    group_state_key,
    txn_offset_topic,
)
from groupcoord.model import (
    GroupConflictError,
    GroupRecord,
    OffsetRecord,
    StoredGroup,
    TopicPartition,
)

#: committed offsets decoded between two turns of the event loop (~4 us each)
DECODES_PER_TURN = 256


class MetaGroupStore:
    """``groupcoord.GroupStore`` over a ``MetaStore`` (embedded or etcd)."""

    def __init__(self, meta: MetaStore) -> None:
        self._meta = meta
        self._pending: deque[tuple[list[Put], asyncio.Future[None]]] = deque()
        self._flusher: asyncio.Task[None] | None = None

    async def load_group(self, group_id: str) -> StoredGroup | None:
        kv = await self._meta.get(group_state_key(group_id))
        if kv is None:
            return None
        return StoredGroup(GroupRecord.from_json(kv.value), kv.mod_revision)

    async def save_group(self, group_id: str, record: GroupRecord, expected_revision: int) -> int:
        key = group_state_key(group_id)
        result = await self._meta.txn(
            [
                Compare(key, "mod_revision", "==", expected_revision),
                Compare(consumer_group_key(group_id), "mod_revision", "==", 0),
            ],
            [Put(key, record.to_json())],
        )
        if not result.succeeded:
            raise GroupConflictError(
                f"group {group_id!r} changed since revision {expected_revision}"
            )
        return result.revision

    async def delete_group(self, group_id: str, expected_revision: int) -> None:
        result = await self._meta.txn(
            [
                Compare(group_state_key(group_id), "mod_revision", "==", expected_revision),
                Compare(consumer_group_key(group_id), "mod_revision", "==", 0),
            ],
            [Delete(group_prefix(group_id), prefix=True)],
        )
        if not result.succeeded:
            raise GroupConflictError(
                f"group {group_id!r} changed since revision {expected_revision}"
            )

    # ---- KIP-848 consumer groups (groupcoord.consumer_coordinator) ----

    async def load_consumer_group(self, group_id: str) -> tuple[bytes, int] | None:
        kv = await self._meta.get(consumer_group_key(group_id))
        return None if kv is None else (kv.value, kv.mod_revision)

    async def load_classic_revision(self, group_id: str) -> int:
        """mod_revision of the classic state (0: none)."""
        kv = await self._meta.get(group_state_key(group_id))
        return 0 if kv is None else kv.mod_revision

    async def save_consumer_group(
        self, group_id: str, value: bytes, expected_revision: int, classic_revision: int = 0
    ) -> int:
        """Write the consumer state if its revision is still ``expected_revision`` and the
        classic state's is ``classic_revision`` (that state is deleted: a conversion)."""
        key, classic = consumer_group_key(group_id), group_state_key(group_id)
        ops: list[Op] = [Put(key, value)]
        if classic_revision:
            ops.append(Delete(classic))
        result = await self._meta.txn(
            [
                Compare(key, "mod_revision", "==", expected_revision),
                Compare(classic, "mod_revision", "==", classic_revision),
            ],
            ops,
        )
        if not result.succeeded:
            raise GroupConflictError(f"consumer group {group_id!r} changed")
        return result.revision

    async def delete_consumer_group(
        self, group_id: str, expected_revision: int, with_offsets: bool
    ) -> None:
        """Delete the consumer state (and every offset with ``with_offsets``: DeleteGroups;
        without: a conversion to a classic group keeps them)."""
        key = consumer_group_key(group_id)
        op = Delete(group_prefix(group_id), prefix=True) if with_offsets else Delete(key)
        result = await self._meta.txn(
            [
                Compare(key, "mod_revision", "==", expected_revision),
                Compare(group_state_key(group_id), "mod_revision", "==", 0),
            ],
            [op],
        )
        if not result.succeeded:
            raise GroupConflictError(f"consumer group {group_id!r} changed")

    async def commit_offsets(
        self, group_id: str, offsets: Sequence[tuple[TopicPartition, OffsetRecord]]
    ) -> None:
        """Group commit: requests arriving while a transaction is in flight are written
        together in the next one; a request is never split unless it alone exceeds the
        store's ops limit."""
        latest = {tp: rec for tp, rec in offsets}  # one Put per key per transaction
        ops = [
            Put(group_offset_key(group_id, tp.topic, tp.partition), rec.to_json())
            for tp, rec in latest.items()
        ]
        if not ops:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((ops, fut))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_commits())
        await fut

    async def _flush_commits(self) -> None:
        while self._pending:
            batch: list[tuple[list[Put], asyncio.Future[None]]] = []
            size, limit = 0, max(1, self._meta.max_txn_ops)
            while self._pending and (not batch or size + len(self._pending[0][0]) <= limit):
                ops, fut = self._pending.popleft()
                batch.append((ops, fut))
                size += len(ops)
            merged: dict[str, Put] = {}
            for ops, _ in batch:
                merged.update((op.key, op) for op in ops)  # a later request's value wins
            try:
                await self._run_chunked(list(merged.values()))
            except Exception as exc:  # noqa: BLE001 - handed to every waiting request
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
            else:
                for _, fut in batch:
                    if not fut.done():
                        fut.set_result(None)

    async def fetch_offsets(self, group_id: str) -> dict[TopicPartition, OffsetRecord]:
        prefix = group_prefix(group_id) + "offsets/"
        result: dict[TopicPartition, OffsetRecord] = {}
        for i, kv in enumerate(await self._meta.range(prefix), 1):
            topic, _, partition = kv.key[len(prefix) :].rpartition("/")
            result[TopicPartition(topic, int(partition))] = OffsetRecord.from_json(kv.value)
            if i % DECODES_PER_TURN == 0:  # a group of thousands of partitions: let others run
                await asyncio.sleep(0)
        return result

    async def delete_offsets(self, group_id: str, partitions: Sequence[TopicPartition]) -> None:
        await self._run_chunked(
            [Delete(group_offset_key(group_id, tp.topic, tp.partition)) for tp in set(partitions)]
        )

    async def list_groups(self) -> list[str]:
        names = {
            unquote(key[len(GROUPS_PREFIX) :].split("/", 1)[0])
            for key in await self._meta.keys(GROUPS_PREFIX)
        }
        return sorted(names)

    async def _run_chunked(self, ops: Sequence[Op]) -> None:
        step = max(1, self._meta.max_txn_ops)
        for i in range(0, len(ops), step):
            await self._meta.txn([], ops[i : i + step])


async def purge_topic_offsets(meta: MetaStore, topic: str, revision: int) -> int:
    """Delete every group's committed offsets of ``topic`` that were written at or before
    ``revision`` (the revision of the topic's deletion), as Kafka drops a deleted topic's
    offsets from its groups: a topic re-created under the name starts with none. Pending
    transactional offsets of the topic (``/txn/{tid}/offsets/...``) go too. Offsets
    committed after ``revision`` (to the re-created topic) stay, because each delete is
    guarded by its key's mod_revision. Returns how many were deleted."""
    doomed = [
        kv
        for prefix, topic_of in (
            (GROUPS_PREFIX, group_offset_topic),
            (TXN_PREFIX, txn_offset_topic),
        )
        for kv in await meta.range(prefix)
        if kv.mod_revision <= revision and topic_of(kv.key) == topic
    ]
    step = max(1, meta.max_txn_ops)
    deleted = 0
    for i in range(0, len(doomed), step):
        chunk = doomed[i : i + step]
        result = await meta.txn(_unchanged(chunk), [Delete(kv.key) for kv in chunk])
        if result.succeeded:
            deleted += len(chunk)
            continue
        for kv in chunk:  # some key changed meanwhile: one at a time, skipping those
            one = await meta.txn(_unchanged([kv]), [Delete(kv.key)])
            deleted += int(one.succeeded)
    return deleted


def _unchanged(kvs: Sequence[KeyValue]) -> list[Compare]:
    return [Compare(kv.key, "mod_revision", "==", kv.mod_revision) for kv in kvs]
