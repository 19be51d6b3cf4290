"""Single-node metadata store with etcd semantics, durable in a data directory.

State is an in-memory sorted map (store revision; create/mod revision and version per key).
Every committed write (put, delete, transaction, lease expiry) is one checksummed record in
an append-only log, fdatasync'd before the call returns and before watchers hear of it.
Writes are serialized by one lock and their append + fdatasync runs in the store's own
worker thread (never queued behind segment uploads in the default executor):
the event loop serves everything else (request reading, segment uploads, reads of the
map) while a flush cycle's commit waits on the disk; a write is applied to the map only
once it is durable, so nothing ever reads a write that a crash could lose. A write whose
caller is cancelled while it waits on the disk still finishes its append and applies it
before it lets the lock go (then raises CancelledError): the revisions stay unique.

Group commit: transactions that arrive while a write holds the lock queue up, and the
next holder writes the queue's head, up to the first transaction whose keys meet an
earlier one's (or that names a prefix), as consecutive revisions in ONE append +
fdatasync. Transactions on disjoint keys commute, so evaluating each against the map as
it was before the group gives what one-by-one would; a failed append fails every write
of the group (none is applied). A flush cycle's commit chunks, sent together, cost one
disk barrier instead of one each.

When the log grows past ``compact_bytes`` (and twice the last snapshot) the map is written
as a snapshot by a task of its own, after the write that made it due was answered: under
the write lock it copies the map (``dict`` and key list; entries are never changed in
place) and rotates the log (a rename and a new file, in the disk thread); it then
encodes and writes the copy (temp + fsync + rename) in a thread of its own while writes
go on, and drops the rotated log. Opening replays snapshot + logs; a torn tail is
dropped (``durable.py``).

A writer holds an exclusive ``flock`` on ``LOCK``. A ``read_only`` store takes no lock and
replays the files as they are (retrying if a compaction races it); it never writes.

The in-memory map, transactions and watches are ``keyspace.py``; the directory (lock, log,
snapshot) is ``durable.py``; this module ties them into the ``MetaStore`` API.

Leases live in memory only: keys written under a lease are deleted when the writer reopens
(a restart ends every lease). Watches are served from in-process queues plus a bounded
in-memory history of recent revisions (older start revisions raise MetaStoreError).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import secrets
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field

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
    TxnResult,
    WatchEvent,
)
from broker.meta.durable import MetaDir
from broker.meta.keyspace import Keyspace, Lease
from segments.offload import Offloader

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Txn:
    """A queued transaction and its answer."""

    compares: Sequence[Compare]
    success: Sequence[Op]
    failure: Sequence[Op]
    result: asyncio.Future[TxnResult]
    # every key it compares, reads or writes; None when a prefix makes that open-ended
    keys: frozenset[str] | None = field(init=False)

    def __post_init__(self) -> None:
        ops = (*self.success, *self.failure)
        if any(not isinstance(o, Put) and o.prefix for o in ops):
            self.keys = None
        else:
            self.keys = frozenset((*(c.key for c in self.compares), *(o.key for o in ops)))


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
        self._read_only = read_only
        self._compact_bytes = compact_bytes
        self._closed = False
        self._space = Keyspace(prefix, history_revisions)
        self._files = MetaDir(path)
        # serializes writes: the compare, the durable append (in a thread) and the apply
        self._write_lock = asyncio.Lock()
        self._queue: collections.deque[_Txn] = collections.deque()  # waiting for the lock
        self._disk: Offloader | None = None  # the log's appends, one at a time
        self._snapshots: Offloader | None = None  # snapshots, beside the appends
        self._expiring: set[asyncio.Task[None]] = set()
        self._compacting: asyncio.Future[None] | None = None  # a snapshot on its way
        if read_only:
            self._files.open_read_only(self._space)
        else:
            self._files.open_writer(self._space)
            try:
                self._drop_leased_keys()
            except BaseException:
                self._files.release()
                raise

    def _drop_leased_keys(self) -> None:
        leased = self._space.leased_keys()
        if leased:
            log.info("metadata store: dropping %d keys of leases ended by restart", len(leased))
            self._commit([wal.LogOp(k, None) for k in leased])

    def _commit(self, ops: list[wal.LogOp]) -> int:
        """Make ``ops`` durable as the next revision, then apply and publish them (on the
        calling thread: only while nothing else can write, i.e. at open)."""
        rev = self._space.rev + 1
        self._durable(wal.encode_record(rev, ops))
        return self._applied(rev, ops)

    async def _commit_async(self, ops: list[wal.LogOp]) -> int:
        """``_commit`` with the append + fdatasync in a worker thread; the caller holds
        ``_write_lock``, so the revision and the log stay in order."""
        rev = self._space.rev + 1
        cancelled = await self._on_disk(self._durable, wal.encode_record(rev, ops))
        self._space.publish(self._space.apply(rev, ops))
        self._compact_soon()
        if cancelled:
            raise asyncio.CancelledError
        return rev

    async def _on_disk(self, fn: Callable[..., object], *args: object) -> bool:
        """Run ``fn(*args)`` in the store's disk thread and wait for it even if the caller
        is cancelled meanwhile (a write that goes on must be finished and applied);
        returns whether it was. Raises ``fn``'s own error."""
        if self._disk is None:
            self._disk = Offloader(1, "meta-log")
        fut = self._disk.run(fn, *args)
        cancelled = False
        while True:
            try:
                await asyncio.shield(fut)
                return cancelled
            except asyncio.CancelledError:
                if fut.cancelled():
                    raise
                cancelled = True

    def _compaction_due(self) -> bool:
        """The log is past ``compact_bytes`` and twice the last snapshot (a large map is
        not rewritten for every few MB of log)."""
        return self._files.log_size > max(self._compact_bytes, 2 * self._files.snap_size)

    def _compact_soon(self) -> None:
        """Start a snapshot if it is due and none is under way (``_compact_now``). The
        write that made it due has its answer already."""
        if self._compacting is None and self._compaction_due():
            self._compacting = asyncio.ensure_future(self._compact_now(force=False))

    async def _compact_now(self, force: bool) -> None:
        """Copy the map and rotate the log under the write lock (the copy is the map at
        the rotation's revision; no append is under way), then encode and write the
        snapshot in its own thread while writes go on (docs/architecture.md, "The embedded
        metadata store's snapshots"). Nothing is lost on failure: the rotated log stays
        until a snapshot covers it."""
        try:
            async with self._write_lock:
                if self._closed or not (force or self._compaction_due()):
                    return
                rev, keys, entries = self._space.rev, list(self._space.keys), dict(self._space.data)
                await self._on_disk(self._files.rotate)
            if self._snapshots is None:
                self._snapshots = Offloader(1, "meta-snapshot")
            await asyncio.shield(
                self._snapshots.run(self._files.write_snapshot, rev, keys, entries)
            )
        except Exception:  # the logs stay as they are: replay still has every write
            log.exception("metadata snapshot failed")
        finally:
            self._compacting = None

    def _durable(self, record: bytes) -> None:
        if self._files.broken:
            raise MetaStoreError("metadata log is in an unknown state after a write error")
        self._files.append(record)

    def _applied(self, rev: int, ops: list[wal.LogOp]) -> int:
        events = self._space.apply(rev, ops)
        self._space.publish(events)
        if self._compaction_due():
            self._files.compact(self._space)
        return rev

    def _check(self, write: bool = False) -> None:
        if self._closed:
            raise MetaStoreError("metadata store is closed")
        if write and self._read_only:
            raise MetaStoreError("read-only")

    async def _txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]
    ) -> TxnResult:
        """Queue the transaction; whoever holds the write lock next writes it, together
        with the other queued transactions on disjoint keys (``_write_group``)."""
        if max(len(compares), len(success), len(failure)) > self.max_txn_ops:
            raise MetaStoreError("too many operations in txn request")
        self._check()
        req = _Txn(compares, success, failure, asyncio.get_running_loop().create_future())
        self._queue.append(req)
        try:
            async with self._write_lock:
                if not req.result.done():
                    if len(self._queue) == 1:  # alone: let transactions sent with it join
                        await asyncio.sleep(0)
                    await self._write_group()
        except asyncio.CancelledError:
            if req in self._queue:  # never taken: it will not be written
                self._queue.remove(req)
            raise
        return req.result.result()

    async def _write_group(self) -> None:
        """Write the queued transactions from the head of the queue up to the first whose
        keys meet an earlier one's (``_Txn.keys``): each its own revision, all in one
        append + fdatasync. Called with the write lock held."""
        group: list[_Txn] = []
        seen: set[str] = set()
        while self._queue:
            req = self._queue[0]
            if group and (req.keys is None or not seen.isdisjoint(req.keys)):
                break
            group.append(self._queue.popleft())
            if req.keys is None:
                break
            seen |= req.keys
        try:
            planned: list[tuple[_Txn, TxnResult, list[wal.LogOp]]] = []
            rev = self._space.rev
            for req in group:
                try:
                    ok, effects, gets = self._plan(req, rev + 1)
                except MetaStoreError as exc:
                    req.result.set_exception(exc)
                    req.result.exception()  # retrieved: its caller may be gone
                    continue
                rev += 1 if effects else 0
                planned.append((req, TxnResult(ok, rev, tuple(gets)), effects))
            await self._commit_group(planned)
        finally:  # nothing taken from the queue is left unanswered
            for req in group:
                if not req.result.done():
                    req.result.set_exception(MetaStoreError("metadata write failed"))
                    req.result.exception()

    def _plan(
        self, req: _Txn, rev: int
    ) -> tuple[bool, list[wal.LogOp], list[tuple[KeyValue, ...]]]:
        self._check()
        ok = all(self._space.holds(c) for c in req.compares)
        ops = req.success if ok else req.failure
        if any(not isinstance(o, Get) for o in ops):
            self._check(write=True)
        self._space.check_intervals(ops)
        effects, gets = self._space.plan(ops, rev)
        return ok, effects, gets

    async def _commit_group(self, planned: list[tuple[_Txn, TxnResult, list[wal.LogOp]]]) -> None:
        """Make the planned writes durable in one append, apply them in revision order,
        then answer every transaction of the group (a cancelled caller's included)."""
        writes = [(res.revision, effects) for _req, res, effects in planned if effects]
        failed: BaseException | None = None
        cancelled = False
        if writes:
            data = b"".join(wal.encode_record(r, e) for r, e in writes)
            try:
                cancelled = await self._on_disk(self._durable, data)
            except asyncio.CancelledError:
                failed = MetaStoreError("metadata log append cancelled")
            except Exception as exc:  # the append's own error (MetaStoreError)
                failed = exc
            if failed is None:
                for r, e in writes:
                    self._space.publish(self._space.apply(r, e))
        for req, res, effects in planned:
            if effects and failed is not None:
                req.result.set_exception(failed)
                req.result.exception()  # retrieved: its caller may be gone
            else:
                req.result.set_result(res)
        if writes and failed is None:
            self._compact_soon()
        if cancelled:
            raise asyncio.CancelledError

    # ---------------------------------------------------------------- public API

    async def get(self, key: str) -> KeyValue | None:
        self._check()
        full = self._space.full(key)
        e = self._space.data.get(full)
        return None if e is None else self._space.kv(full, e)

    async def range(self, prefix: str) -> list[KeyValue]:
        self._check()
        space = self._space
        return [space.kv(k, space.data[k]) for k in space.iter_prefix(space.full(prefix))]

    async def keys(self, prefix: str) -> list[str]:
        self._check()
        space = self._space
        cut = len(space.prefix)
        return [k[cut:] for k in space.iter_prefix(space.full(prefix))]

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        self._check(write=True)
        return (await self._txn((), (Put(key, value, lease),), ())).revision

    async def delete(self, key: str, prefix: bool = False) -> int:
        self._check(write=True)
        n = len(self._space.overlay_keys(self._space.full(key), prefix, {}))
        if n:
            await self._txn((), (Delete(key, prefix),), ())
        return n

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        self._check()
        return await self._txn(compares, success, failure)

    async def grant_lease(self, ttl: int) -> int:
        self._check(write=True)
        ttl = max(int(ttl), 1)
        leases = self._space.leases
        lease_id = secrets.randbits(62) | 1
        while lease_id in leases:
            lease_id = secrets.randbits(62) | 1
        loop = asyncio.get_running_loop()
        leases[lease_id] = Lease(ttl, loop.call_later(ttl, self._expire, lease_id))
        return lease_id

    async def refresh_lease(self, lease_id: int) -> int:
        self._check(write=True)
        lease = self._space.leases.get(lease_id)
        if lease is None:
            raise LeaseExpiredError(f"lease {lease_id:x} has expired or was revoked")
        lease.handle.cancel()
        loop = asyncio.get_running_loop()
        lease.handle = loop.call_later(lease.ttl, self._expire, lease_id)
        return lease.ttl

    async def revoke_lease(self, lease_id: int) -> None:
        self._check(write=True)
        await self._end_lease(lease_id)

    async def _end_lease(self, lease_id: int) -> None:
        lease = self._space.leases.pop(lease_id, None)  # refreshes fail from here on
        if lease is None:
            return
        lease.handle.cancel()
        async with self._write_lock:
            if self._closed:
                return
            data = self._space.data
            keys = sorted(k for k in lease.keys if (e := data.get(k)) and e.lease == lease_id)
            if keys:
                await self._commit_async([wal.LogOp(k, None) for k in keys])

    def _expire(self, lease_id: int) -> None:
        if self._closed:
            return
        task = asyncio.ensure_future(self._expire_now(lease_id))
        self._expiring.add(task)
        task.add_done_callback(self._expiring.discard)

    async def _expire_now(self, lease_id: int) -> None:
        try:
            await self._end_lease(lease_id)
        except MetaStoreError as exc:
            log.error("metadata store: expiring lease %x failed: %s", lease_id, exc)

    def watch(
        self, prefix: str, start_revision: int | None = None
    ) -> AsyncGenerator[WatchEvent, None]:
        """Events under ``prefix`` with revision >= ``start_revision`` (default: the revision
        after the one current when ``watch`` is called)."""
        self._check()
        start = start_revision if start_revision else self._space.rev + 1
        return self._space.watch(self._space.full(prefix), start)

    async def compact(self) -> None:
        """Write a snapshot now and drop the log it covers (normally automatic)."""
        self._check(write=True)
        while self._compacting is not None:  # one at a time: snapshots land in order
            await asyncio.shield(self._compacting)
        self._compacting = asyncio.ensure_future(self._compact_now(force=True))
        await asyncio.shield(self._compacting)

    @property
    def revision(self) -> int:
        return self._space.rev

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for lease in self._space.leases.values():
            lease.handle.cancel()
        self._space.leases.clear()
        self._space.close_watchers()
        while self._compacting is not None:  # a snapshot under way ends first
            await self._compacting  # (one not yet begun finds the store closed)
        async with self._write_lock:  # a write's append in its thread finishes first
            self._files.release()
        for offloader in (self._disk, self._snapshots):
            if offloader is not None:
                offloader.close()
