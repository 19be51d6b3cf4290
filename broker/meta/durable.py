"""The durable side of the embedded metadata store: its data directory.

``MetaDir`` owns the files of one store directory: the exclusive ``flock`` on ``LOCK``
that a writer holds, the append-only log (``LOG``; one checksummed record per revision,
fdatasync'd on append) and the snapshot (``SNAPSHOT``; the whole map, written to a temp
file, fsync'd and renamed, after which the log is truncated). Opening replays snapshot +
log into a ``Keyspace``: a writer drops a torn log tail; a read-only reader takes no lock
and starts again when a concurrent compaction changes the files under it. The formats
are in ``wal.py``.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os

from broker.meta import wal
from broker.meta.base import MetaStoreError
from broker.meta.keyspace import Keyspace

log = logging.getLogger(__name__)

SNAPSHOT = "snapshot"
LOG = "wal.log"
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
        """Load snapshot + log into memory. Returns (end of good log prefix, log size)."""
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
        found = wal.read_file(self._file(LOG))
        data = found[0] if found else b""
        good_end = 0
        for rec in wal.iter_records(data):
            good_end = rec.end
            if rec.revision <= space.rev:
                continue
            if rec.revision != space.rev + 1:
                if writer:
                    raise MetaStoreError(
                        f"{self._file(LOG)}: revision gap {space.rev} -> {rec.revision}"
                    )
                raise _Stale
            space.apply(rec.revision, rec.ops)
        if not writer and snap is not None:
            # a snapshot at the same revision holds the same state; a newer one may have
            # come with a truncated log that we read part of: start again
            if wal.snapshot_revision(self._file(SNAPSHOT)) != self.snap_rev:
                raise _Stale
        return good_end, len(data)

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
        """Write ``space`` as the snapshot and truncate the log (a failure is logged)."""
        data = wal.encode_snapshot(space.rev, space.keys, space.data)
        try:
            wal.write_atomic(self._file(SNAPSHOT), data)
            os.ftruncate(self._log_fd, 0)
            os.fsync(self._log_fd)
        except OSError as exc:
            log.error("metadata snapshot of %s failed: %s", self.path, exc)
            return
        self.snap_rev = space.rev
        self.snap_size = len(data)
        self.log_size = 0
