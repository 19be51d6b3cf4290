"""The local store's file-level pieces (``segments/local_store.py``): ETags (CRC-32C,
recorded on the file in an extended attribute), buffered writes, the ``file://`` URL's
switches, and the fsyncs. No state: ``LocalStore`` and ``segments/local_batch.py`` use
them.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import parse_qs

import crc32c as _crc32c

from segments.store import Buffer

TMP_MARKER = ".tmp-"  # in the names of temp files (never listed as objects)
ETAG_XATTR = "user.kafscale.etag"

_StatKey = tuple[int, int, int, int]  # dev, inode, mtime_ns, size
_MD5_HEX = frozenset("0123456789abcdef")
# file:// URL parameters (docs/operations.md, "Tuning"), their deprecated environment
# variables (None: none) and their defaults
URL_SWITCHES: dict[str, tuple[str | None, bool]] = {
    "direct_io": ("KAFSCALE_DIRECT_IO", False),
    "keep_page_cache": ("KAFSCALE_KEEP_PAGE_CACHE", False),
    "syncfs": (None, True),  # batches made durable by syncfs (segments/local_batch.py)
}
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _switches(query: str) -> dict[str, bool]:
    """The store's switches from a ``file://`` URL's query; a switch the URL does not
    set comes from its environment variable (deprecated: ``=1`` turns it on)."""
    params = {k: v[-1].lower() for k, v in parse_qs(query, keep_blank_values=True).items()}
    unknown = sorted(set(params) - set(URL_SWITCHES))
    if unknown:
        raise ValueError(f"unknown file:// store parameter(s) {', '.join(unknown)}")
    out = {}
    for name, (env, default) in URL_SWITCHES.items():
        value = params.get(name)
        if value is None:
            out[name] = os.environ.get(env, "0") == "1" if env is not None else default
        elif value in _TRUE or value in _FALSE:
            out[name] = value in _TRUE
        else:
            raise ValueError(f"file:// store parameter {name}={value!r}: want true or false")
    return out


def crc_etag(crc: int, size: int) -> str:
    """The ETag of content with this CRC-32C and size."""
    return f"crc32c-{crc:08x}-{size:x}"


def _is_md5(etag: str) -> bool:
    """An ETag in the legacy form (hex MD5, as written before the CRC ETags)."""
    return len(etag) == 32 and set(etag) <= _MD5_HEX


def _hash_fd(fd: int, md5: bool) -> str:
    """The ETag of a file's content, hashed (CRC form, or the legacy MD5 form)."""
    digest = hashlib.md5(usedforsecurity=False) if md5 else None
    crc = pos = 0
    while chunk := os.pread(fd, 1 << 20, pos):
        if digest is not None:
            digest.update(chunk)
        else:
            crc = _crc32c.crc32c(chunk, crc)
        pos += len(chunk)
    return digest.hexdigest() if digest is not None else crc_etag(crc, pos)


def _write_buffered(
    fd: int, data: Sequence[Buffer], known: int | None = None, piece: int | None = None
) -> int:
    """Write ``data`` through the page cache; returns its CRC-32C (``known``, when the
    caller gave it, is returned without hashing). With ``piece``, every ``piece`` bytes
    written are made durable (``fdatasync``) before more are written: the disk then
    never holds more than one piece of this object's writeback in its queue."""
    crc = 0
    dirty = 0  # bytes written since the last fdatasync (with ``piece``)
    for buf in data:
        if known is None:
            crc = _crc32c.crc32c(buf, crc)
        view = memoryview(buf)
        while view:
            n = os.write(fd, view if piece is None else view[: piece - dirty])
            view = view[n:]
            if piece is not None:
                dirty += n
                if dirty >= piece:
                    os.fdatasync(fd)
                    dirty = 0
    return crc if known is None else known


def _stat_key(st: os.stat_result) -> _StatKey:
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def _xattr_etag(fd: int, st: os.stat_result) -> str | None:
    """The ETag recorded on the file, if still valid for its current mtime and size."""
    try:
        raw = os.getxattr(fd, ETAG_XATTR).decode("ascii")
    except (OSError, UnicodeDecodeError):
        return None
    parts = raw.split(" ")
    if len(parts) != 3 or parts[1:] != [str(st.st_mtime_ns), str(st.st_size)]:
        return None
    return parts[0]


def _record_etag(fd: int, st: os.stat_result, etag: str) -> None:
    try:
        os.setxattr(fd, ETAG_XATTR, f"{etag} {st.st_mtime_ns} {st.st_size}".encode("ascii"))
    except OSError:  # no xattr support or a read-only file: hashing stays the fallback
        pass


def _drop_cached(fd: int) -> None:
    """Drop a durable file's (clean) pages from the page cache; only advice: a file
    system that does not take it loses nothing."""
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass


@dataclass(slots=True)
class TmpObject:
    """An object written to its temp file (``LocalStore._write_tmp``), fd still open."""

    key: str
    final: str
    directory: str
    tmp: str
    fd: int
    stat_key: _StatKey  # (dev, inode, mtime_ns, size): the ETag cache's key
    etag: str


def fsync_dir(path: str) -> None:
    """fsync a directory: the names linked or unlinked in it survive a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


SYS_ROOT = "/sys"  # Linux sysfs (tests point it at a tree of their own)


def unjournaled_ext4(path: str) -> str | None:
    """The name of the block device under ``path`` when it holds an ext4 file system
    without a journal (sysfs: ``fs/ext4/<device>/journal_task`` reads ``<none>``), else
    None (a journal, another file system, no sysfs). On such a file system a crash
    leaves the file system to fsck, ``syncfs`` writes every dirty inode back by itself
    (docs/benchmarks.md, "Round 6"), and a new inode is found by walking past every
    inode of its block group freed in the last 60-300 s (docs/benchmarks.md, "Round 22")."""
    try:
        dev = os.stat(path).st_dev
        block = os.path.join(SYS_ROOT, "dev", "block", f"{os.major(dev)}:{os.minor(dev)}")
        name = os.path.basename(os.path.realpath(block))
        with open(os.path.join(SYS_ROOT, "fs", "ext4", name, "journal_task")) as f:
            return name if f.read().strip() == "<none>" else None
    except OSError:
        return None
