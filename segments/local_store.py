"""``LocalStore``: the object store as a directory (``file://PATH``), for a single node.

Keys are relative paths under the root. ``put_if_absent`` is atomic and exclusive: the
bytes go to a temp file in the target directory, are fsynced, and the temp file is
hard-linked to the final name (``link`` fails if the name exists), then the directory is
fsynced. A crash leaves at most a stray temp file (ignored by ``list``), never a
half-written object at a key.

Each PUT costs two fsyncs, and both are needed before the PUT may return (a flush cycle
acknowledges records only after its PUTs returned and its metadata commit was made
durable, docs/architecture.md, "Durability of a flush cycle"): the file's ``fsync``
makes the bytes durable *before* the name points at them (so a crash never leaves a
partial object at a key), and the directory's ``fsync`` makes the name durable (without
it a crash may lose the link, and a committed manifest entry would name nothing). Since
segment format version 2 a flush cycle writes one object per partition (the index
inside). A cycle of many partitions (8 or more) goes through ``put_many_if_absent``
instead: the same two steps for the whole batch, each one ``syncfs`` of the file system
instead of an fsync per file and per directory (``segments/local_batch.py``).

ETags are ``crc32c-<CRC-32C of the content, 8 hex>-<size, hex>``, computed while writing
(hardware CRC: ~0.07 ms per MB, where the MD5 that S3 returns cost ~1.4 ms per MB, a
quarter of the broker's produce CPU; docs/benchmarks.md) and remembered per (inode,
mtime, size). ETags are opaque to every user (compared for equality only); an object
written before this change keeps its recorded MD5 ETag, and an ``If-Match`` with a
32-hex MD5 on an object without a recorded ETag is checked by hashing it with MD5. A
caller that already has the object's CRC-32C passes it (``put_if_absent``'s ``crc32c``)
and nothing is hashed at all (docs/benchmarks.md, "Round 4: CRC passes"). With
``direct_io`` (``file://PATH?direct_io=true``; the older ``KAFSCALE_DIRECT_IO=1`` still
works) new objects are written with ``O_DIRECT``
(``segments/direct_io.py``). Without it, a PUT of ``DIRECT_MIN_BYTES`` (2 MiB) or more
that is not paced (a flush cycle's under plain produce at full speed, a compaction's) is
written that way (unless ``keep_page_cache``): the copy into new page-cache pages
was ~40 % of the broker's CPU under plain produce at full speed, and its pages would be
dropped after the ``fsync`` anyway; smaller PUTs and merges go through the page cache,
where a write that waits for the disk cost them more (docs/benchmarks.md, "Round 25").

A written object's pages are dropped from the page cache right after its ``fsync``
(``POSIX_FADV_DONTNEED``; clean by then, so nothing is lost or written twice): the broker
keeps what it just wrote in its own segment cache, and on the project's VM a buffered
write into ever new page-cache pages cost 3-3.7 ms of system CPU per MB (and 4.5-7 ms of
wall time per 1 MB PUT) against 0.5-0.6 ms when the pages freed by the previous PUT are
reused (docs/benchmarks.md, "Round 3: produce profile"). Readers of evicted segments
read the disk instead. ``file://PATH?keep_page_cache=true`` keeps the pages (the old
way; the deprecated ``KAFSCALE_KEEP_PAGE_CACHE=1`` too).

Background writers (merges) use ``put_paced_if_absent``: the same PUT, written in pieces
that are each made durable before the next, so that they never fill the disk's queue
ahead of a flush cycle's PUT (docs/benchmarks.md, "Round 19").

ETags are also recorded on the file itself, in the extended attribute
``user.kafscale.etag`` as ``"<etag> <mtime_ns> <size>"``, so another process (a Spark
task checking ``If-Match``) gets them without re-hashing the object; the attribute only
counts while the file's mtime and size still match (an in-place rewrite makes it stale).
Without xattr support, or for an object written by something else, the object is hashed
once on first need (and the attribute written when possible).
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import uuid
from collections.abc import Sequence
from dataclasses import replace

from segments.direct_io import write_direct
from segments.local_batch import batches, put_batch
from segments.local_files import (
    TMP_MARKER,
    TmpObject,
    _drop_cached,
    _hash_fd,
    _is_md5,
    _record_etag,
    _stat_key,
    _StatKey,
    _switches,
    _write_buffered,
    _xattr_etag,
    crc_etag,
    fsync_dir,
    unjournaled_ext4,
)
from segments.offload import to_thread
from segments.shared import is_range_key, resolve, translate
from segments.store import (
    Buffer,
    ObjectExistsError,
    ObjectInfo,
    ObjectNotFoundError,
    PreconditionFailedError,
    PutItem,
    StoreError,
    put_each,
)

log = logging.getLogger(__name__)

# Ranged reads up to 1 MiB run inline: measured from page cache, 4 KiB-1 MiB inline took
# 11-114 us versus 115-358 us through asyncio.to_thread; at 8 MiB the thread wins.
INLINE_READ_MAX = 1 << 20
MAP_MIN = 1 << 20  # get_buffer maps reads at least this large (segments/local_store.py)
_ETAG_CACHE_MAX = 65536
# put_paced_if_absent: bytes written per fdatasync. A 1 MiB flush PUT takes ~2.4 ms of
# this project's VM disk; 256 KiB keeps a flush's wait behind a merge well under that
PACED_PIECE_BYTES = 256 * 1024
# a PUT (not paced) at least this large is written with O_DIRECT by default
# (segments/direct_io.py): buffered, it was ~40 % of the broker's CPU under plain produce
DIRECT_MIN_BYTES = 2 << 20


class LocalStore:
    def __init__(
        self,
        root: str,
        direct_io: bool = False,
        keep_page_cache: bool = False,
        syncfs: bool = True,
    ) -> None:
        self.root = os.path.abspath(root)
        # a batch's barriers are syncfs calls (False: an fsync per file and directory)
        self.syncfs = syncfs
        self.direct_io = direct_io  # new objects written with O_DIRECT (segments/direct_io.py)
        # written objects leave the page cache once durable (keep_page_cache: not)
        self.drop_cache = not keep_page_cache
        os.makedirs(self.root, exist_ok=True)
        self._etags: dict[_StatKey, str] = {}
        self._dirs: set[str] = set()  # directories known to exist (batch writes)

    @classmethod
    def from_url(cls, url: str) -> LocalStore:
        """``file://./data``, ``file:///abs/path`` or a plain path; a ``file://`` URL
        takes the switches ``?direct_io=true`` and ``?keep_page_cache=true``
        (docs/operations.md, "Tuning")."""
        path, query = url, ""
        if url.startswith("file://"):
            path, _, query = url[len("file://") :].partition("?")
        if not path:
            raise ValueError(f"empty path in store URL {url!r}")
        store = cls(path, **_switches(query))
        if (device := unjournaled_ext4(store.root)) is not None:
            log.warning(
                "local store %s is on ext4 without a journal (%s): after a crash the file "
                "system needs fsck, a flush cycle's syncfs barriers are slow there, and "
                "every new segment file costs more CPU the more files were deleted in the "
                "last minutes (docs/operations.md, Tuning)",
                store.root,
                device,
            )
        return store

    def __repr__(self) -> str:
        return f"LocalStore({self.root!r})"

    # ------------------------------------------------------------------ helpers

    def _path(self, key: str) -> str:
        parts = key.split("/")
        if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"invalid object key {key!r}")
        if any(p.startswith(".") and TMP_MARKER in p for p in parts):
            raise ValueError(f"invalid object key {key!r}")
        return os.path.join(self.root, *parts)

    def _remember(self, st: os.stat_result, etag: str) -> None:
        self._remember_key(_stat_key(st), etag)

    def _remember_key(self, key: _StatKey, etag: str) -> None:
        if len(self._etags) >= _ETAG_CACHE_MAX:
            self._etags.clear()
        self._etags[key] = etag

    def _known_dir(self, directory: str) -> None:
        """``_mkdirs`` once per directory (the broker never removes one; a write that
        finds it gone anyway forgets it, ``segments/local_batch.py``)."""
        if directory not in self._dirs:
            self._mkdirs(directory)
            if len(self._dirs) >= _ETAG_CACHE_MAX:
                self._dirs.clear()
            self._dirs.add(directory)

    def _etag_of_fd(self, fd: int, st: os.stat_result, want: str | None = None) -> str:
        """The object's ETag; with ``want`` (an If-Match value) in the legacy MD5 form
        and a recorded ETag in the CRC form, the MD5 of the content instead."""
        etag = self._etags.get(_stat_key(st))
        if etag is None:
            etag = _xattr_etag(fd, st)
            if etag is not None:
                self._remember(st, etag)
        if etag is None:
            etag = _hash_fd(fd, md5=False)
            self._remember(st, etag)
            _record_etag(fd, st, etag)
        if want is not None and _is_md5(want) and not _is_md5(etag):
            return _hash_fd(fd, md5=True)  # a manifest written before the CRC ETags
        return etag

    def _etag_known(self, key: str) -> bool:
        try:
            return _stat_key(os.stat(self._path(key))) in self._etags
        except OSError:
            return True  # missing: the inline path raises the right error at once

    def _mkdirs(self, directory: str) -> None:
        """Create missing parent directories, fsyncing each new one's parent."""
        missing: list[str] = []
        d = directory
        while not os.path.isdir(d):
            missing.append(d)
            d = os.path.dirname(d)
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except FileExistsError:
                continue
            fsync_dir(os.path.dirname(d))

    def _direct(self, data: Sequence[Buffer], piece: int | None) -> bool:
        """Whether a new object is written with ``O_DIRECT``: every one with
        ``direct_io``; else a PUT of ``DIRECT_MIN_BYTES`` or more, unless the store
        keeps written pages cached (``keep_page_cache``). Background writes (``piece``:
        merges) and smaller PUTs go through the page cache: a write that waits for the
        disk cost them more than the copy (docs/benchmarks.md, "Round 25")."""
        if self.direct_io:
            return True
        if piece is not None or not self.drop_cache:
            return False
        return sum(memoryview(b).nbytes for b in data) >= DIRECT_MIN_BYTES

    def _write_tmp(
        self, key: str, data: Sequence[Buffer], known: int | None, piece: int | None = None
    ) -> TmpObject:
        """``data`` in a new temp file beside ``key``'s final name, its ETag recorded;
        not yet durable and not yet named: the caller fsyncs, links and closes.
        ``piece``: written in pieces of that many bytes (``put_paced_if_absent``)."""
        final = self._path(key)
        directory, name = os.path.split(final)
        self._mkdirs(directory)
        if os.path.lexists(final):
            raise ObjectExistsError(key)
        tmp = os.path.join(directory, f".{name}{TMP_MARKER}{uuid.uuid4().hex}")
        direct = write_direct(tmp, data, known, piece) if self._direct(data, piece) else None
        if direct is not None:
            fd = os.open(tmp, os.O_WRONLY)
        else:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            crc = direct[0] if direct is not None else _write_buffered(fd, data, known, piece)
            st = os.fstat(fd)
            etag = crc_etag(crc, st.st_size)
            _record_etag(fd, st, etag)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        return TmpObject(key, final, directory, tmp, fd, _stat_key(st), etag)

    def _put_sync(
        self,
        key: str,
        data: Sequence[Buffer],
        known: int | None = None,
        piece: int | None = None,
    ) -> str:
        obj = self._write_tmp(key, data, known, piece)
        try:
            try:
                os.fsync(obj.fd)
                if self.drop_cache:  # clean now: its pages go back for the next write
                    _drop_cached(obj.fd)
            finally:
                os.close(obj.fd)
            try:
                os.link(obj.tmp, obj.final)
            except FileExistsError:
                raise ObjectExistsError(key) from None
        finally:
            os.unlink(obj.tmp)
        fsync_dir(obj.directory)
        # link/unlink change neither inode, mtime nor size
        self._remember_key(obj.stat_key, obj.etag)
        return obj.etag

    def _open_range(
        self, key: str, start: int | None, end: int | None, if_match: str | None
    ) -> tuple[int, int, int]:
        """(fd, lo, hi): ``key`` opened for reading, its ETag checked against
        ``if_match``, and the byte range clamped to its size; the caller closes ``fd``."""
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFoundError(key) from None
        try:
            st = os.fstat(fd)
            want = None if if_match is None else if_match.strip('"')
            if want is not None and self._etag_of_fd(fd, st, want) != want:
                raise PreconditionFailedError(key)
        except BaseException:
            os.close(fd)
            raise
        lo = 0 if start is None else max(0, start)
        hi = st.st_size if end is None else min(end, st.st_size)
        return fd, lo, hi

    def _get_sync(
        self, key: str, start: int | None, end: int | None, if_match: str | None
    ) -> bytes:
        fd, lo, hi = self._open_range(key, start, end, if_match)
        try:
            if hi <= lo:
                return b""
            data = os.pread(fd, hi - lo, lo)
            while len(data) < hi - lo:  # pread may return short on some filesystems
                more = os.pread(fd, hi - lo - len(data), lo + len(data))
                if not more:
                    break
                data += more
            return data
        finally:
            os.close(fd)

    def _head_sync(self, key: str) -> ObjectInfo | None:
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            st = os.fstat(fd)
            return ObjectInfo(key, st.st_size, self._etag_of_fd(fd, st), st.st_mtime)
        finally:
            os.close(fd)

    def _list_sync(self, prefix: str) -> list[ObjectInfo]:
        # Walk only the directory the prefix names (e.g. "default/t/0/seg" -> "default/t/0").
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        top = os.path.join(self.root, *base.split("/")) if base else self.root
        out: list[ObjectInfo] = []
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
            rel_dir = "" if rel_dir == "." else rel_dir + "/"
            for fname in filenames:
                if fname.startswith(".") and TMP_MARKER in fname:
                    continue
                key = rel_dir + fname
                if key.startswith(prefix):
                    info = self._head_sync(key)
                    if info is not None:
                        out.append(info)
        out.sort(key=lambda i: i.key)
        return out

    # ------------------------------------------------------------------ ObjectStore

    async def put_if_absent(
        self, key: str, data: Sequence[Buffer], *, crc32c: int | None = None
    ) -> str:
        """``ObjectStore.put_if_absent``. ``crc32c`` (the concatenation's CRC-32C) becomes
        the ETag's CRC without hashing the bytes. Nothing here can check it (that would be
        the pass it saves), so a wrong one would record an ETag that is not the content's
        CRC: equality checks against the recorded ETag still agree, and a later re-hash
        (another host, a file system without xattrs) would give another ETag, so an
        ``If-Match`` fails (PreconditionFailedError) rather than reading silently. Hence
        the rule: pass only a CRC derived from these very bytes; the broker passes
        ``BuiltSegment.crc32c``, hashed from the segment's framing and the batches' CRCs
        that produce validation checked against their bytes (docs/format.md)."""
        return await self._put(key, data, crc32c, None)

    async def put_paced_if_absent(
        self, key: str, data: Sequence[Buffer], *, crc32c: int | None = None
    ) -> str:
        """``put_if_absent`` for background writers (``segments.store.put_background``:
        merges): the same object with the same guarantees, but it reaches the disk in
        pieces of ``PACED_PIECE_BYTES``, each made durable before the next is written. A
        flush cycle's small PUT on the same disk then waits behind one piece at most, not
        behind a merged segment of megabytes (docs/benchmarks.md, "Round 19"). Objects
        written with ``direct_io`` are not paced: they bypass the page cache anyway."""
        return await self._put(key, data, crc32c, PACED_PIECE_BYTES)

    async def _put(
        self, key: str, data: Sequence[Buffer], crc32c: int | None, piece: int | None
    ) -> str:
        if is_range_key(key):
            raise StoreError(f"put {key}: a range of a shared object cannot be written")
        try:
            return await to_thread(self._put_sync, key, data, crc32c, piece)
        except OSError as exc:
            raise StoreError(f"put {key}: {exc}") from exc

    async def put_many_if_absent(
        self, items: Sequence[PutItem], concurrency: int = 1
    ) -> list[str | BaseException]:
        """Each item as ``put_if_absent`` would write it; per item its ETag or its error.
        A batch of many objects has two ``syncfs`` barriers in all instead of two fsyncs
        per object (``segments/local_batch.py``); fewer objects, or ``syncfs=false``, go
        as ``concurrency`` concurrent ``put_if_absent`` calls."""
        if not batches(self, len(items)):
            return await put_each(self, items, concurrency)
        try:
            return list(await put_batch(self, items))
        except OSError as exc:  # the store's root itself: every item fails
            return [StoreError(f"put {i.key}: {exc}") for i in items]

    async def get(
        self,
        key: str,
        start: int | None = None,
        end: int | None = None,
        if_match: str | None = None,
    ) -> bytes:
        key, start, end = translate(key, start, end)  # a range of a shared object
        small = start is not None and end is not None and end - start <= INLINE_READ_MAX
        if small and if_match is not None:
            small = self._etag_known(key)  # hashing a whole object belongs in a thread
        try:
            if small:
                return self._get_sync(key, start, end, if_match)
            return await to_thread(self._get_sync, key, start, end, if_match)
        except OSError as exc:
            raise StoreError(f"get {key}: {exc}") from exc

    async def get_buffer(
        self,
        key: str,
        start: int | None = None,
        end: int | None = None,
        if_match: str | None = None,
    ) -> Buffer:
        """``get`` for the read path: a read of at least ``MAP_MIN`` bytes is a read-only
        view of the file's pages (``mmap``, populated at once): no copy and no fresh
        memory; the mapping outlives a later unlink of the file (objects are never
        rewritten in place). Smaller reads are ``get``'s."""
        key, start, end = translate(key, start, end)  # a range of a shared object
        if start is not None and end is not None and end - start < MAP_MIN:
            return await self.get(key, start, end, if_match)
        try:
            return await to_thread(self._map_sync, key, start, end, if_match)
        except OSError as exc:
            raise StoreError(f"get {key}: {exc}") from exc

    def _map_sync(
        self, key: str, start: int | None, end: int | None, if_match: str | None
    ) -> Buffer:
        fd, lo, hi = self._open_range(key, start, end, if_match)
        try:
            if hi - lo < MAP_MIN:
                return self._get_sync(key, lo, hi, None) if hi > lo else b""
            base = lo - lo % mmap.ALLOCATIONGRANULARITY  # only the pages read are mapped
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            mapped = mmap.mmap(fd, hi - base, flags=flags, prot=mmap.PROT_READ, offset=base)
            return memoryview(mapped)[lo - base : hi - base]
        finally:
            os.close(fd)

    async def head(self, key: str) -> ObjectInfo | None:
        if (span := resolve(key)) is not None:  # a range of a shared object: its size
            info = await self.head(span[0])
            return None if info is None else replace(info, key=key, size=span[2])
        try:
            if self._etag_known(key):
                return self._head_sync(key)
            return await to_thread(self._head_sync, key)
        except OSError as exc:
            raise StoreError(f"head {key}: {exc}") from exc

    async def delete(self, key: str) -> None:
        if is_range_key(key):  # only the shared sweep deletes shared objects
            raise StoreError(f"delete {key}: a range of a shared object cannot be deleted")
        path = self._path(key)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno == errno.EISDIR:
                return
            raise StoreError(f"delete {key}: {exc}") from exc

    async def list(self, prefix: str) -> list[ObjectInfo]:
        try:
            return await to_thread(self._list_sync, prefix)
        except OSError as exc:
            raise StoreError(f"list {prefix}: {exc}") from exc

    async def close(self) -> None:
        return None
