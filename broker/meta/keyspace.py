"""The in-memory engine of the embedded metadata store: keys, transactions, watches.

``Keyspace`` holds the sorted map with etcd semantics (a store revision; create/mod
revision, version and lease per key), applies committed log records to it, evaluates a
transaction's compares and operations against it into the log ops to commit, tracks the
keys written under each live lease, and serves watches from in-process queues plus a
bounded history of recent revisions. It does no I/O: ``embedded.py`` makes each record
durable (``durable.py``) before applying it here.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import deque
from collections.abc import AsyncGenerator, Iterable, Iterator, Sequence

from broker.meta import wal
from broker.meta.base import (
    Compare,
    Delete,
    Get,
    KeyValue,
    LeaseExpiredError,
    MetaStoreError,
    Op,
    Put,
    WatchEvent,
)

_MISSING = object()


class Entry:
    """One key's value and etcd metadata; never changed once made (``apply`` replaces it)."""

    __slots__ = ("value", "create_revision", "mod_revision", "version", "lease")

    def __init__(self, value: bytes, create: int, mod: int, version: int, lease: int) -> None:
        self.value = value
        self.create_revision = create
        self.mod_revision = mod
        self.version = version
        self.lease = lease


class Lease:
    __slots__ = ("ttl", "keys", "handle")

    def __init__(self, ttl: int, handle: asyncio.TimerHandle) -> None:
        self.ttl = ttl
        self.keys: set[str] = set()
        self.handle = handle


def compare(actual: bytes | int, op: str, expected: bytes | int) -> bool:
    if op == "==":
        return actual == expected
    if op == "!=":
        return actual != expected
    if op == "<":
        return actual < expected  # type: ignore[operator]
    if op == ">":
        return actual > expected  # type: ignore[operator]
    raise MetaStoreError(f"unknown compare operator {op!r}")


class Keyspace:
    """The map, live leases and watchers; keys are stored with ``prefix`` prepended."""

    def __init__(self, prefix: str, history_size: int) -> None:
        self.prefix = prefix
        self.history_size = history_size
        self.leases: dict[int, Lease] = {}
        self.watchers: list[tuple[str, asyncio.Queue[WatchEvent | None]]] = []
        self.reset()

    def reset(self) -> None:
        self.rev = 0
        self.data: dict[str, Entry] = {}
        self.keys: list[str] = []
        self.history: deque[tuple[int, tuple[WatchEvent, ...]]] = deque(maxlen=self.history_size)

    # ------------------------------------------------------------ snapshots

    def load(self, rev: int, entries: Iterable[wal.SnapEntry]) -> None:
        """Start from a snapshot's entries at revision ``rev``."""
        for e in entries:
            self.data[e.key] = Entry(e.value, e.create_revision, e.mod_revision, e.version, e.lease)
        self.keys = sorted(self.data)
        self.rev = rev

    def leased_keys(self) -> list[str]:
        return [k for k in self.keys if self.data[k].lease]

    # ------------------------------------------------------------- core state

    def full(self, key: str) -> str:
        return self.prefix + key

    def kv(self, full: str, e: Entry) -> KeyValue:
        return KeyValue(
            full[len(self.prefix) :],
            e.value,
            e.create_revision,
            e.mod_revision,
            e.version,
            e.lease,
        )

    def iter_prefix(self, full_prefix: str) -> Iterator[str]:
        i = bisect.bisect_left(self.keys, full_prefix)
        keys = self.keys
        while i < len(keys) and keys[i].startswith(full_prefix):
            yield keys[i]
            i += 1

    def apply(self, rev: int, ops: Sequence[wal.LogOp]) -> list[WatchEvent]:
        """Apply one committed record's effects to memory; returns its events."""
        events: list[WatchEvent] = []
        for op in ops:
            old = self.data.get(op.key)
            if old is not None and old.lease and old.lease in self.leases:
                self.leases[old.lease].keys.discard(op.key)
            if op.value is None:
                if old is None:
                    continue
                del self.data[op.key]
                del self.keys[bisect.bisect_left(self.keys, op.key)]
                events.append(WatchEvent("delete", op.key, b"", rev))
                continue
            if old is None:
                self.data[op.key] = Entry(op.value, rev, rev, 1, op.lease)
                bisect.insort(self.keys, op.key)
            else:  # a new entry, never a change in place: a snapshot's copy of the map
                # (``dict(data)``) is then the map as it was, while it is written off the lock
                self.data[op.key] = Entry(
                    op.value, old.create_revision, rev, old.version + 1, op.lease
                )
            if op.lease and op.lease in self.leases:
                self.leases[op.lease].keys.add(op.key)
            events.append(WatchEvent("put", op.key, op.value, rev))
        self.rev = rev
        self.history.append((rev, tuple(events)))
        return events

    def publish(self, events: Sequence[WatchEvent]) -> None:
        for prefix, queue in self.watchers:
            for ev in events:
                if ev.key.startswith(prefix):
                    queue.put_nowait(ev)

    # ------------------------------------------------------------ transactions

    def holds(self, c: Compare) -> bool:
        e = self.data.get(self.full(c.key))
        if c.target == "value":
            return e is not None and compare(e.value, c.op, c.value)
        actual = 0 if e is None else getattr(e, c.target)
        return compare(actual, c.op, c.value)

    @staticmethod
    def check_intervals(ops: Sequence[Op]) -> None:
        puts = [o.key for o in ops if isinstance(o, Put)]
        if len(set(puts)) != len(puts):
            raise MetaStoreError("duplicate key given in txn request")
        for d in ops:
            if isinstance(d, Delete):
                for k in puts:
                    if k == d.key or (d.prefix and k.startswith(d.key)):
                        raise MetaStoreError("duplicate key given in txn request")

    def plan(
        self, ops: Sequence[Op], rev: int = 0
    ) -> tuple[list[wal.LogOp], list[tuple[KeyValue, ...]]]:
        """The log ops of a transaction branch (as revision ``rev``, default the next),
        and its Get results."""
        overlay: dict[str, Entry | None] = {}
        effects: list[wal.LogOp] = []
        gets: list[tuple[KeyValue, ...]] = []
        rev = rev or self.rev + 1
        for op in ops:
            if isinstance(op, Get):
                gets.append(self._overlay_get(op, overlay))
            elif isinstance(op, Put):
                self._put_effect(op, rev, overlay, effects)
            else:
                for full in self.overlay_keys(self.full(op.key), op.prefix, overlay):
                    overlay[full] = None
                    effects.append(wal.LogOp(full, None))
        return effects, gets

    def _lookup(self, full: str, overlay: dict[str, Entry | None]) -> Entry | None:
        found = overlay.get(full, _MISSING)
        return self.data.get(full) if found is _MISSING else found  # type: ignore[return-value]

    def overlay_keys(self, full: str, prefix: bool, overlay: dict[str, Entry | None]) -> list[str]:
        if not prefix:
            return [full] if self._lookup(full, overlay) is not None else []
        keys = set(self.iter_prefix(full))
        keys.update(k for k in overlay if k.startswith(full))
        return sorted(k for k in keys if self._lookup(k, overlay) is not None)

    def _overlay_get(self, op: Get, overlay: dict[str, Entry | None]) -> tuple[KeyValue, ...]:
        out: list[KeyValue] = []
        for full in self.overlay_keys(self.full(op.key), op.prefix, overlay):
            e = self._lookup(full, overlay)
            if e is not None:
                out.append(self.kv(full, e))
        return tuple(out)

    def _put_effect(
        self, op: Put, rev: int, overlay: dict[str, Entry | None], effects: list[wal.LogOp]
    ) -> None:
        if op.lease and op.lease not in self.leases:
            raise LeaseExpiredError(f"requested lease {op.lease:x} not found")
        full = self.full(op.key)
        old = self._lookup(full, overlay)
        value = bytes(op.value)
        if old is None:
            overlay[full] = Entry(value, rev, rev, 1, op.lease)
        else:
            overlay[full] = Entry(value, old.create_revision, rev, old.version + 1, op.lease)
        effects.append(wal.LogOp(full, value, op.lease))

    # ------------------------------------------------------------------ watches

    async def watch(self, full: str, start: int) -> AsyncGenerator[WatchEvent, None]:
        """Events under the stored prefix ``full`` from revision ``start`` (keys returned
        without the store prefix)."""
        floor = self.history[0][0] - 1 if self.history else self.rev
        if start <= floor:
            raise MetaStoreError(f"required revision {start} has been compacted (floor {floor})")
        queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue()
        watcher = (full, queue)
        self.watchers.append(watcher)
        cut = len(self.prefix)
        try:
            backlog = [
                ev
                for rev, evs in self.history
                if rev >= start
                for ev in evs
                if ev.key.startswith(full)
            ]
            for ev in backlog:
                yield WatchEvent(ev.type, ev.key[cut:], ev.value, ev.mod_revision)
            while True:
                item = await queue.get()
                if item is None:
                    raise MetaStoreError("metadata store is closed")
                yield WatchEvent(item.type, item.key[cut:], item.value, item.mod_revision)
        finally:
            if watcher in self.watchers:
                self.watchers.remove(watcher)

    def close_watchers(self) -> None:
        for _, queue in self.watchers:
            queue.put_nowait(None)
