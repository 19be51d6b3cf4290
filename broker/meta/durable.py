"""The durable side of the embedded metadata store: its data directory.

``MetaDir`` owns the files of one store directory: the exclusive ``flock`` on ``LOCK``
that a writer holds, the append-only log (``LOG``; one checksummed record per revision,
fdatasync'd on append) and the snapshot (``SNAPSHOT``; the whole map at one revision,
written to a temp file, fsync'd and renamed). The formats are in ``wal.py``.

A snapshot is taken in two steps, so that writes never wait for it to be encoded and
written: under the store's write lock the log is rotated (``LOG`` renamed to ``PREV_LOG``,
a new ``LOG`` begun; ``rotate``), then, off the lock and off the log's thread, the copy of
the map taken at that revision is written as the snapshot and ``PREV_LOG`` unlinked
(``write_snapshot``). Every record of ``PREV_LOG`` is at or below the snapshot's revision.

Opening replays snapshot + ``PREV_LOG`` + ``LOG`` (records at or below the snapshot's
revision are skipped; a gap in revisions is an error), so a crash at any point of a
snapshot loses nothing: before the rename the old snapshot and both logs hold every
write, after it the new snapshot does. A writer drops a torn ``LOG`` tail and finishes an
interrupted snapshot before it serves. A read-only reader takes no lock and starts again
when a concurrent rotation or snapshot changes the files under it.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import time
from collections.abc import Mapping, Sequence

from broker.meta import wal
from broker.meta.base import MetaStoreError
from broker.meta.keyspace import Keyspace

log = logging.getLogger(__name__)

SNAPSHOT = "snapshot"
LOG = "wal.log"
PREV_LOG = "wal.prev"  # the log before the last rotation, until its snapshot is written
LOCK = "LOCK"
_OPEN_ATTEMPTS = 50


class _Stale(Exception):
    """The files changed underneath a read-only replay: start again."""


class MetaDir:
    """The lock, log and snapshot files of a store directory (see the module docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.broken = False
        self.snap_rev = 0
        self.snap_size = 0  # bytes of the last snapshot written or read
        self.log_size = 0
        self._lock_fd = -1
        self._log_fd = -1

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    # ------------------------------------------------------------------ opening

    def open_writer(self, space: Keyspace) -> None:
        """Lock the directory, replay it into ``space`` and open the log for appending."""
        os.makedirs(self.path, exist_ok=True)
        self._lock_fd = os.open(self._file(LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._lock_fd)
            self._lock_fd = -1
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise MetaStoreError(
                    f"metadata directory {self.path} is in use by another process "
                    "(open it read-only, or stop the other broker)"
                ) from exc
            raise MetaStoreError(f"cannot lock {self.path}: {exc}") from exc
        try:
            good_end, size = self._replay(space, writer=True)
            self._log_fd = os.open(self._file(LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            if good_end < size:
                log.warning(
                    "metadata log %s: dropping %d bytes of torn tail",
                    self._file(LOG),
                    size - good_end,
                )
                os.ftruncate(self._log_fd, good_end)
                os.fsync(self._log_fd)
            wal.fsync_dir(self.path)
            self.log_size = good_end
            if os.path.exists(self._file(PREV_LOG)):  # a snapshot a crash interrupted
                self.compact(space)
        except BaseException:
            self.release()
            raise

    def open_read_only(self, space: Keyspace) -> None:
        """Replay the directory into ``space`` without locking it."""
        if not os.path.isdir(self.path):
            raise MetaStoreError(f"metadata directory {self.path} does not exist")
        for _ in range(_OPEN_ATTEMPTS):
            try:
                self._replay(space, writer=False)
                return
            except _Stale:
                space.reset()
                self.snap_rev = 0
        raise MetaStoreError(f"metadata directory {self.path} kept changing while reading it")

    def _replay(self, space: Keyspace, writer: bool) -> tuple[int, int]:
        """Load snapshot + ``PREV_LOG`` + ``LOG`` into memory. Returns (end of the good
        prefix of ``LOG``, its size). A reader notes which file ``LOG`` is before it reads
        anything: if a rotation made a new one meanwhile, what it read of the logs may
        miss records (``_Stale``)."""
        log_inode = None if writer else _inode(self._file(LOG))
        snap = wal.read_file(self._file(SNAPSHOT))
        if snap is not None:
            try:
                self.snap_rev, entries = wal.decode_snapshot(snap[0])
                self.snap_size = len(snap[0])
            except wal.CorruptFileError as exc:
                if writer:
                    raise MetaStoreError(f"{self._file(SNAPSHOT)}: {exc}") from exc
                raise _Stale from exc
            space.load(self.snap_rev, entries)
        good_end = size = 0
        for name in (PREV_LOG, LOG):
            found = wal.read_file(self._file(name))
            data = found[0] if found else b""
            good_end, size = self._apply_log(space, name, data, writer), len(data)
            if name == PREV_LOG and good_end < size:  # never appended to once rotated
                raise MetaStoreError(
                    f"{self._file(name)}: {size - good_end} bytes after its last whole record"
                )
        if not writer:
            if (found[1].st_ino if found else None) != log_inode:
                raise _Stale  # rotated while we read: records may sit in a file we missed
            if snap is not None and wal.snapshot_revision(self._file(SNAPSHOT)) != self.snap_rev:
                # a snapshot at the same revision holds the same state; a newer one may
                # have come with a log that we read part of: start again
                raise _Stale
        return good_end, size

    def _apply_log(self, space: Keyspace, name: str, data: bytes, writer: bool) -> int:
        """Apply the records of one log file past ``space``'s revision; returns the end
        of its last whole record."""
        good_end = 0
        for rec in wal.iter_records(data):
            good_end = rec.end
            if rec.revision <= space.rev:
                continue
            if rec.revision != space.rev + 1:
                if writer:
                    raise MetaStoreError(
                        f"{self._file(name)}: revision gap {space.rev} -> {rec.revision}"
                    )
                raise _Stale
            space.apply(rec.revision, rec.ops)
        return good_end

    def release(self) -> None:
        if self._log_fd >= 0:
            os.close(self._log_fd)
            self._log_fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = -1

    # ------------------------------------------------------------------ writing

    def append(self, record: bytes) -> None:
        """Append ``record`` to the log and fdatasync it (on failure, cut it off again)."""
        try:
            view = memoryview(record)
            while view:
                view = view[os.write(self._log_fd, view) :]
            os.fdatasync(self._log_fd)
        except OSError as exc:
            try:
                os.ftruncate(self._log_fd, self.log_size)
            except OSError:
                self.broken = True
            raise MetaStoreError(f"metadata log write failed: {exc}") from exc
        self.log_size += len(record)

    def compact(self, space: Keyspace) -> None:
        """Write ``space`` as the snapshot, then truncate the log and drop ``PREV_LOG``, in
        the calling thread (at open, while nothing else can write; a failure is logged)."""
        try:
            self.write_snapshot(space.rev, space.keys, space.data)
            os.ftruncate(self._log_fd, 0)
            os.fsync(self._log_fd)
        except OSError as exc:
            log.error("metadata snapshot of %s failed: %s", self.path, exc)
            return
        self.log_size = 0

    def rotate(self) -> bool:
        """Begin a new ``LOG``, the old one becoming ``PREV_LOG``; False (nothing done) if
        ``PREV_LOG`` is still there (its snapshot failed: the next one covers it). Called
        with the store's write lock held, in the log's thread, so no append is under way.
        On failure the log is as it was (or the directory ``broken``) and OSError raised."""
        if self.broken:
            raise MetaStoreError("metadata log is in an unknown state after a write error")
        current, prev = self._file(LOG), self._file(PREV_LOG)
        if os.path.exists(prev):
            return False
        os.rename(current, prev)
        fd = -1
        try:
            fd = os.open(current, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
            wal.fsync_dir(self.path)
        except OSError:
            if fd >= 0:
                os.close(fd)
            try:  # appends still go to the old file, under its old name again
                os.replace(prev, current)
            except OSError:
                self.broken = True
            raise
        os.close(self._log_fd)
        self._log_fd = fd
        self.log_size = 0
        return True

    def write_snapshot(
        self, revision: int, keys: Sequence[str], entries: Mapping[str, wal.Stored]
    ) -> None:
        """Write the map ``entries`` (in the order of ``keys``) as the snapshot at
        ``revision`` and drop ``PREV_LOG``, whose records it covers. Runs beside the
        log's appends (off the write lock): ``keys`` and ``entries`` are copies taken at
        the rotation, and entries are never changed in place. Raises OSError."""
        data = wal.encode_snapshot(revision, keys, entries, _let_others_run)
        wal.write_atomic(self._file(SNAPSHOT), data)
        self._drop_prev()
        self.snap_rev = revision
        self.snap_size = len(data)

    def _drop_prev(self) -> None:
        try:
            os.unlink(self._file(PREV_LOG))
        except FileNotFoundError:
            return
        wal.fsync_dir(self.path)


def _let_others_run() -> None:
    time.sleep(0)  # releases the GIL: a thread waiting for it takes it now


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None
