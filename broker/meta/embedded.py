"""Single-node metadata store with etcd semantics, durable in a data directory.

State is an in-memory sorted map (store revision; create/mod revision and version per key).
Every committed write (put, delete, transaction, lease expiry) is one checksummed record in
an append-only log, fdatasync'd before the call returns and before watchers hear of it.
When the log grows past ``compact_bytes`` the map is written as a snapshot (temp + fsync +
rename) and the log is truncated. Opening replays snapshot + log; a torn tail is dropped.

A writer holds an exclusive ``flock`` on ``LOCK``. A ``read_only`` store takes no lock and
replays the files as they are (retrying if a compaction races it); it never writes.

Leases live in memory only: keys written under a lease are deleted when the writer reopens
(a restart ends every lease). Watches are served from in-process queues plus a bounded
in-memory history of recent revisions (older start revisions raise MetaStoreError).
"""

from __future__ import annotations

import asyncio
import bisect
import errno
import fcntl
import logging
import os
import secrets
from collections import deque
from collections.abc import AsyncGenerator, Iterator, Sequence

from broker.meta import _wal
from broker.meta.base import (
    Compare,
    Delete,
    Get,
    KeyValue,
    LeaseExpiredError,
    MetaStoreError,
    Op,
    Put,
    TxnResult,
    WatchEvent,
)

log = logging.getLogger(__name__)

SNAPSHOT = "snapshot"
LOG = "wal.log"
LOCK = "LOCK"
_OPEN_ATTEMPTS = 50
_MISSING = object()


class _Entry:
    __slots__ = ("value", "create_revision", "mod_revision", "version", "lease")

    def __init__(self, value: bytes, create: int, mod: int, version: int, lease: int) -> None:
        self.value = value
        self.create_revision = create
        self.mod_revision = mod
        self.version = version
        self.lease = lease


class _Lease:
    __slots__ = ("ttl", "keys", "handle")

    def __init__(self, ttl: int, handle: asyncio.TimerHandle) -> None:
        self.ttl = ttl
        self.keys: set[str] = set()
        self.handle = handle


class _Stale(Exception):
    """The files changed underneath a read-only replay: start again."""


def _compare(actual: bytes | int, op: str, expected: bytes | int) -> bool:
    if op == "==":
        return actual == expected
    if op == "!=":
        return actual != expected
    if op == "<":
        return actual < expected  # type: ignore[operator]
    if op == ">":
        return actual > expected  # type: ignore[operator]
    raise MetaStoreError(f"unknown compare operator {op!r}")


class EmbeddedStore:
    """The embedded ``MetaStore``: see the module docstring."""

    max_txn_ops: int = 128

    def __init__(
        self,
        path: str,
        prefix: str = "/kafscale",
        read_only: bool = False,
        *,
        compact_bytes: int = 4 << 20,
        history_revisions: int = 5_000,
    ) -> None:
        self._path = path
        self._prefix = prefix
        self._read_only = read_only
        self._compact_bytes = compact_bytes
        self._history_size = history_revisions
        self._closed = False
        self._broken = False
        self._lock_fd = -1
        self._log_fd = -1
        self._log_size = 0
        self._leases: dict[int, _Lease] = {}
        self._watchers: list[tuple[str, asyncio.Queue[WatchEvent | None]]] = []
        self._reset_state()
        if read_only:
            self._open_read_only()
        else:
            self._open_writer()

    # ------------------------------------------------------------------ opening

    def _reset_state(self) -> None:
        self._rev = 0
        self._snap_rev = 0
        self._data: dict[str, _Entry] = {}
        self._keys: list[str] = []
        self._history: deque[tuple[int, tuple[WatchEvent, ...]]] = deque(maxlen=self._history_size)

    def _file(self, name: str) -> str:
        return os.path.join(self._path, name)

    def _open_writer(self) -> None:
        os.makedirs(self._path, exist_ok=True)
        self._lock_fd = os.open(self._file(LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._lock_fd)
            self._lock_fd = -1
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise MetaStoreError(
                    f"metadata directory {self._path} is in use by another process "
                    "(open it read-only, or stop the other broker)"
                ) from exc
            raise MetaStoreError(f"cannot lock {self._path}: {exc}") from exc
        try:
            good_end, size = self._replay(writer=True)
            self._log_fd = os.open(self._file(LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            if good_end < size:
                log.warning(
                    "metadata log %s: dropping %d bytes of torn tail",
                    self._file(LOG),
                    size - good_end,
                )
                os.ftruncate(self._log_fd, good_end)
                os.fsync(self._log_fd)
            _wal.fsync_dir(self._path)
            self._log_size = good_end
            self._drop_leased_keys()
        except BaseException:
            self._release_files()
            raise

    def _open_read_only(self) -> None:
        if not os.path.isdir(self._path):
            raise MetaStoreError(f"metadata directory {self._path} does not exist")
        for _ in range(_OPEN_ATTEMPTS):
            try:
                self._replay(writer=False)
                return
            except _Stale:
                self._reset_state()
        raise MetaStoreError(f"metadata directory {self._path} kept changing while reading it")

    def _replay(self, writer: bool) -> tuple[int, int]:
        """Load snapshot + log into memory. Returns (end of good log prefix, log size)."""
        snap = _wal.read_file(self._file(SNAPSHOT))
        if snap is not None:
            try:
                self._snap_rev, entries = _wal.decode_snapshot(snap[0])
            except _wal.CorruptFileError as exc:
                if writer:
                    raise MetaStoreError(f"{self._file(SNAPSHOT)}: {exc}") from exc
                raise _Stale from exc
            for e in entries:
                self._data[e.key] = _Entry(
                    e.value, e.create_revision, e.mod_revision, e.version, e.lease
                )
            self._keys = sorted(self._data)
            self._rev = self._snap_rev
        found = _wal.read_file(self._file(LOG))
        data = found[0] if found else b""
        good_end = 0
        for rec in _wal.iter_records(data):
            good_end = rec.end
            if rec.revision <= self._rev:
                continue
            if rec.revision != self._rev + 1:
                if writer:
                    raise MetaStoreError(
                        f"{self._file(LOG)}: revision gap {self._rev} -> {rec.revision}"
                    )
                raise _Stale
            self._apply(rec.revision, rec.ops)
        if not writer and snap is not None:
            # a snapshot at the same revision holds the same state; a newer one may have
            # come with a truncated log that we read part of: start again
            if _wal.snapshot_revision(self._file(SNAPSHOT)) != self._snap_rev:
                raise _Stale
        return good_end, len(data)

    def _drop_leased_keys(self) -> None:
        leased = [k for k in self._keys if self._data[k].lease]
        if leased:
            log.info("metadata store: dropping %d keys of leases ended by restart", len(leased))
            self._commit([_wal.LogOp(k, None) for k in leased])

    def _release_files(self) -> None:
        if self._log_fd >= 0:
            os.close(self._log_fd)
            self._log_fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = -1

    # ------------------------------------------------------------- core state

    def _full(self, key: str) -> str:
        return self._prefix + key

    def _kv(self, full: str, e: _Entry) -> KeyValue:
        return KeyValue(
            full[len(self._prefix) :],
            e.value,
            e.create_revision,
            e.mod_revision,
            e.version,
            e.lease,
        )

    def _iter_prefix(self, full_prefix: str) -> Iterator[str]:
        i = bisect.bisect_left(self._keys, full_prefix)
        keys = self._keys
        while i < len(keys) and keys[i].startswith(full_prefix):
            yield keys[i]
            i += 1

    def _apply(self, rev: int, ops: Sequence[_wal.LogOp]) -> list[WatchEvent]:
        """Apply one committed record's effects to memory; returns its events."""
        events: list[WatchEvent] = []
        for op in ops:
            old = self._data.get(op.key)
            if old is not None and old.lease and old.lease in self._leases:
                self._leases[old.lease].keys.discard(op.key)
            if op.value is None:
                if old is None:
                    continue
                del self._data[op.key]
                del self._keys[bisect.bisect_left(self._keys, op.key)]
                events.append(WatchEvent("delete", op.key, b"", rev))
                continue
            if old is None:
                self._data[op.key] = _Entry(op.value, rev, rev, 1, op.lease)
                bisect.insort(self._keys, op.key)
            else:
                old.value, old.mod_revision, old.lease = op.value, rev, op.lease
                old.version += 1
            if op.lease and op.lease in self._leases:
                self._leases[op.lease].keys.add(op.key)
            events.append(WatchEvent("put", op.key, op.value, rev))
        self._rev = rev
        self._history.append((rev, tuple(events)))
        return events

    def _append_log(self, record: bytes) -> None:
        try:
            view = memoryview(record)
            while view:
                view = view[os.write(self._log_fd, view) :]
            os.fdatasync(self._log_fd)
        except OSError as exc:
            try:
                os.ftruncate(self._log_fd, self._log_size)
            except OSError:
                self._broken = True
            raise MetaStoreError(f"metadata log write failed: {exc}") from exc
        self._log_size += len(record)

    def _commit(self, ops: list[_wal.LogOp]) -> int:
        """Make ``ops`` durable as the next revision, then apply and publish them."""
        if self._broken:
            raise MetaStoreError("metadata log is in an unknown state after a write error")
        rev = self._rev + 1
        self._append_log(_wal.encode_record(rev, ops))
        events = self._apply(rev, ops)
        for prefix, queue in self._watchers:
            for ev in events:
                if ev.key.startswith(prefix):
                    queue.put_nowait(ev)
        if self._log_size > self._compact_bytes:
            self._compact()
        return rev

    def _compact(self) -> None:
        entries = (
            _wal.SnapEntry(k, e.value, e.create_revision, e.mod_revision, e.version, e.lease)
            for k in self._keys
            for e in (self._data[k],)
        )
        try:
            _wal.write_atomic(self._file(SNAPSHOT), _wal.encode_snapshot(self._rev, entries))
            os.ftruncate(self._log_fd, 0)
            os.fsync(self._log_fd)
        except OSError as exc:
            log.error("metadata snapshot of %s failed: %s", self._path, exc)
            return
        self._snap_rev = self._rev
        self._log_size = 0

    def _check(self, write: bool = False) -> None:
        if self._closed:
            raise MetaStoreError("metadata store is closed")
        if write and self._read_only:
            raise MetaStoreError("read-only")

    # ------------------------------------------------------------ transactions

    def _txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]
    ) -> TxnResult:
        if max(len(compares), len(success), len(failure)) > self.max_txn_ops:
            raise MetaStoreError("too many operations in txn request")
        ok = all(self._holds(c) for c in compares)
        ops = success if ok else failure
        if any(not isinstance(o, Get) for o in ops):
            self._check(write=True)
        self._check_intervals(ops)
        overlay: dict[str, _Entry | None] = {}
        effects: list[_wal.LogOp] = []
        gets: list[tuple[KeyValue, ...]] = []
        rev = self._rev + 1
        for op in ops:
            if isinstance(op, Get):
                gets.append(self._overlay_get(op, overlay))
            elif isinstance(op, Put):
                self._put_effect(op, rev, overlay, effects)
            else:
                for full in self._overlay_keys(self._full(op.key), op.prefix, overlay):
                    overlay[full] = None
                    effects.append(_wal.LogOp(full, None))
        revision = self._commit(effects) if effects else self._rev
        return TxnResult(ok, revision, tuple(gets))

    def _holds(self, c: Compare) -> bool:
        e = self._data.get(self._full(c.key))
        if c.target == "value":
            return e is not None and _compare(e.value, c.op, c.value)
        actual = 0 if e is None else getattr(e, c.target)
        return _compare(actual, c.op, c.value)

    @staticmethod
    def _check_intervals(ops: Sequence[Op]) -> None:
        puts = [o.key for o in ops if isinstance(o, Put)]
        if len(set(puts)) != len(puts):
            raise MetaStoreError("duplicate key given in txn request")
        for d in ops:
            if isinstance(d, Delete):
                for k in puts:
                    if k == d.key or (d.prefix and k.startswith(d.key)):
                        raise MetaStoreError("duplicate key given in txn request")

    def _lookup(self, full: str, overlay: dict[str, _Entry | None]) -> _Entry | None:
        found = overlay.get(full, _MISSING)
        return self._data.get(full) if found is _MISSING else found  # type: ignore[return-value]

    def _overlay_keys(
        self, full: str, prefix: bool, overlay: dict[str, _Entry | None]
    ) -> list[str]:
        if not prefix:
            return [full] if self._lookup(full, overlay) is not None else []
        keys = set(self._iter_prefix(full))
        keys.update(k for k in overlay if k.startswith(full))
        return sorted(k for k in keys if self._lookup(k, overlay) is not None)

    def _overlay_get(self, op: Get, overlay: dict[str, _Entry | None]) -> tuple[KeyValue, ...]:
        out: list[KeyValue] = []
        for full in self._overlay_keys(self._full(op.key), op.prefix, overlay):
            e = self._lookup(full, overlay)
            if e is not None:
                out.append(self._kv(full, e))
        return tuple(out)

    def _put_effect(
        self, op: Put, rev: int, overlay: dict[str, _Entry | None], effects: list[_wal.LogOp]
    ) -> None:
        if op.lease and op.lease not in self._leases:
            raise LeaseExpiredError(f"requested lease {op.lease:x} not found")
        full = self._full(op.key)
        old = self._lookup(full, overlay)
        value = bytes(op.value)
        if old is None:
            overlay[full] = _Entry(value, rev, rev, 1, op.lease)
        else:
            overlay[full] = _Entry(value, old.create_revision, rev, old.version + 1, op.lease)
        effects.append(_wal.LogOp(full, value, op.lease))

    # ---------------------------------------------------------------- public API

    async def get(self, key: str) -> KeyValue | None:
        self._check()
        full = self._full(key)
        e = self._data.get(full)
        return None if e is None else self._kv(full, e)

    async def range(self, prefix: str) -> list[KeyValue]:
        self._check()
        return [self._kv(k, self._data[k]) for k in self._iter_prefix(self._full(prefix))]

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        self._check(write=True)
        return self._txn((), (Put(key, value, lease),), ()).revision

    async def delete(self, key: str, prefix: bool = False) -> int:
        self._check(write=True)
        n = len(self._overlay_keys(self._full(key), prefix, {}))
        if n:
            self._txn((), (Delete(key, prefix),), ())
        return n

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        self._check()
        return self._txn(compares, success, failure)

    async def grant_lease(self, ttl: int) -> int:
        self._check(write=True)
        ttl = max(int(ttl), 1)
        lease_id = secrets.randbits(62) | 1
        while lease_id in self._leases:
            lease_id = secrets.randbits(62) | 1
        loop = asyncio.get_running_loop()
        self._leases[lease_id] = _Lease(ttl, loop.call_later(ttl, self._expire, lease_id))
        return lease_id

    async def refresh_lease(self, lease_id: int) -> int:
        self._check(write=True)
        lease = self._leases.get(lease_id)
        if lease is None:
            raise LeaseExpiredError(f"lease {lease_id:x} has expired or was revoked")
        lease.handle.cancel()
        loop = asyncio.get_running_loop()
        lease.handle = loop.call_later(lease.ttl, self._expire, lease_id)
        return lease.ttl

    async def revoke_lease(self, lease_id: int) -> None:
        self._check(write=True)
        self._end_lease(lease_id)

    def _end_lease(self, lease_id: int) -> None:
        lease = self._leases.pop(lease_id, None)
        if lease is None:
            return
        lease.handle.cancel()
        keys = sorted(k for k in lease.keys if (e := self._data.get(k)) and e.lease == lease_id)
        if keys:
            self._commit([_wal.LogOp(k, None) for k in keys])

    def _expire(self, lease_id: int) -> None:
        if self._closed:
            return
        try:
            self._end_lease(lease_id)
        except MetaStoreError as exc:
            log.error("metadata store: expiring lease %x failed: %s", lease_id, exc)

    def watch(
        self, prefix: str, start_revision: int | None = None
    ) -> AsyncGenerator[WatchEvent, None]:
        """Events under ``prefix`` with revision >= ``start_revision`` (default: the revision
        after the one current when ``watch`` is called)."""
        self._check()
        start = start_revision if start_revision else self._rev + 1
        return self._watch(self._full(prefix), start)

    async def _watch(self, full: str, start: int) -> AsyncGenerator[WatchEvent, None]:
        floor = self._history[0][0] - 1 if self._history else self._rev
        if start <= floor:
            raise MetaStoreError(f"required revision {start} has been compacted (floor {floor})")
        queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue()
        watcher = (full, queue)
        self._watchers.append(watcher)
        cut = len(self._prefix)
        try:
            backlog = [
                ev
                for rev, evs in self._history
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
            if watcher in self._watchers:
                self._watchers.remove(watcher)

    async def compact(self) -> None:
        """Write a snapshot now and truncate the log (normally automatic)."""
        self._check(write=True)
        self._compact()

    @property
    def revision(self) -> int:
        return self._rev

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for lease in self._leases.values():
            lease.handle.cancel()
        self._leases.clear()
        for _, queue in self._watchers:
            queue.put_nowait(None)
        self._release_files()
