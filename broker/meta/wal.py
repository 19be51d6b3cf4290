"""On-disk formats of the embedded metadata store: write-ahead log records and snapshots.

Log record (one per committed revision), big-endian::

    payload length u32 | CRC-32C of payload u32 | payload
    payload = revision u64 | op count u16 | ops
    op      = kind u8 (1 put, 2 delete) | key length u16 | key
              put only: value length u32 | lease u64 | value

Snapshot (the whole map at one revision, written to a temp file, fsync'd, renamed)::

    magic "KMSS" | version u16 | revision u64 | entry count u32 | entries | CRC-32C u32
    entry = key length u16 | key | value length u32 | value
            | create u64 | mod u64 | version u64 | lease u64

This module does plain file I/O only; the store decides when to call it.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from crc32c import crc32c

from segments.local_files import fsync_dir

_FRAME = struct.Struct(">II")
_REC_HEAD = struct.Struct(">QH")
_OP_HEAD = struct.Struct(">BH")
_PUT_TAIL = struct.Struct(">IQ")
_SNAP_HEAD = struct.Struct(">4sHQI")
_SNAP_KEY = struct.Struct(">H")
_SNAP_VAL = struct.Struct(">I")
_SNAP_META = struct.Struct(">QQQQ")
_CRC = struct.Struct(">I")

SNAP_MAGIC = b"KMSS"
SNAP_VERSION = 1
SNAP_STEP = 512  # entries encoded between two calls of ``between`` (~0.35 ms)
OP_PUT = 1
OP_DELETE = 2
MAX_RECORD = 1 << 30


class CorruptFileError(Exception):
    """A snapshot failed its checksum or is malformed."""


@dataclass(frozen=True, slots=True)
class LogOp:
    """One effect of a committed write: a put (value, lease) or a delete (value None)."""

    key: str
    value: bytes | None
    lease: int = 0


@dataclass(frozen=True, slots=True)
class LogRecord:
    revision: int
    ops: tuple[LogOp, ...]
    end: int  # byte offset just past this record in the log


@dataclass(frozen=True, slots=True)
class SnapEntry:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


def encode_record(revision: int, ops: Iterable[LogOp]) -> bytes:
    parts: list[bytes] = []
    count = 0
    for op in ops:
        key = op.key.encode()
        count += 1
        if op.value is None:
            parts += (_OP_HEAD.pack(OP_DELETE, len(key)), key)
        else:
            parts += (
                _OP_HEAD.pack(OP_PUT, len(key)),
                key,
                _PUT_TAIL.pack(len(op.value), op.lease),
                op.value,
            )
    payload = _REC_HEAD.pack(revision, count) + b"".join(parts)
    return _FRAME.pack(len(payload), crc32c(payload)) + payload


def _decode_payload(payload: memoryview, end: int) -> LogRecord:
    revision, count = _REC_HEAD.unpack_from(payload, 0)
    pos = _REC_HEAD.size
    ops: list[LogOp] = []
    for _ in range(count):
        kind, klen = _OP_HEAD.unpack_from(payload, pos)
        pos += _OP_HEAD.size
        key = bytes(payload[pos : pos + klen]).decode()
        pos += klen
        if kind == OP_DELETE:
            ops.append(LogOp(key, None))
            continue
        if kind != OP_PUT:
            raise ValueError(f"unknown op kind {kind}")
        vlen, lease = _PUT_TAIL.unpack_from(payload, pos)
        pos += _PUT_TAIL.size
        ops.append(LogOp(key, bytes(payload[pos : pos + vlen]), lease))
        pos += vlen
    if pos != len(payload):
        raise ValueError("record length mismatch")
    return LogRecord(revision, tuple(ops), end)


def iter_records(data: bytes) -> Iterator[LogRecord]:
    """Decode records until the end or the first torn/corrupt one (then stop quietly).

    The caller learns where the good prefix ends from the last record's ``end``.
    """
    view = memoryview(data)
    pos = 0
    while pos + _FRAME.size <= len(view):
        length, crc = _FRAME.unpack_from(view, pos)
        start = pos + _FRAME.size
        if length > MAX_RECORD or start + length > len(view):
            return
        payload = view[start : start + length]
        if crc32c(payload) != crc:
            return
        try:
            record = _decode_payload(payload, start + length)
        except (ValueError, struct.error, UnicodeDecodeError):
            return
        yield record
        pos = start + length


class Stored(Protocol):
    """What a snapshot stores of a key (``keyspace.Entry``, ``SnapEntry``)."""

    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


def encode_snapshot(
    revision: int,
    keys: Sequence[str],
    entries: Mapping[str, Stored],
    between: Callable[[], object] | None = None,
) -> bytes:
    """The snapshot of ``entries`` in the order of ``keys`` (each a key of ``entries``).
    One pass that builds no object per entry: 13.5 ms for 20,000 entries, where making
    a ``SnapEntry`` of each first took 26.5 ms (medians; docs/benchmarks.md, "Round
    22"). ``between`` is called after every ``SNAP_STEP`` entries: off the event loop's
    thread, ``time.sleep(0)`` hands the GIL to a thread that waits for it, where the
    interpreter would let the encoding hold it for its whole switch interval (5 ms)."""
    parts: list[bytes] = []
    append = parts.append
    key_len, value_len, meta = _SNAP_KEY.pack, _SNAP_VAL.pack, _SNAP_META.pack
    for start in range(0, len(keys), SNAP_STEP):
        if between is not None and start:
            between()
        for key in keys[start : start + SNAP_STEP]:
            e = entries[key]
            raw, value = key.encode(), e.value
            append(key_len(len(raw)))
            append(raw)
            append(value_len(len(value)))
            append(value)
            append(meta(e.create_revision, e.mod_revision, e.version, e.lease))
    body = _SNAP_HEAD.pack(SNAP_MAGIC, SNAP_VERSION, revision, len(keys)) + b"".join(parts)
    return body + _CRC.pack(crc32c(body))


def decode_snapshot(data: bytes) -> tuple[int, list[SnapEntry]]:
    if len(data) < _SNAP_HEAD.size + _CRC.size:
        raise CorruptFileError("snapshot too short")
    view = memoryview(data)
    body = view[: -_CRC.size]
    (crc,) = _CRC.unpack_from(view, len(view) - _CRC.size)
    if crc32c(body) != crc:
        raise CorruptFileError("snapshot checksum mismatch")
    magic, version, revision, count = _SNAP_HEAD.unpack_from(body, 0)
    if magic != SNAP_MAGIC or version != SNAP_VERSION:
        raise CorruptFileError("not a metadata snapshot")
    pos = _SNAP_HEAD.size
    entries: list[SnapEntry] = []
    try:
        for _ in range(count):
            (klen,) = _SNAP_KEY.unpack_from(body, pos)
            pos += _SNAP_KEY.size
            key = bytes(body[pos : pos + klen]).decode()
            pos += klen
            (vlen,) = _SNAP_VAL.unpack_from(body, pos)
            pos += _SNAP_VAL.size
            value = bytes(body[pos : pos + vlen])
            pos += vlen
            create, mod, ver, lease = _SNAP_META.unpack_from(body, pos)
            pos += _SNAP_META.size
            entries.append(SnapEntry(key, value, create, mod, ver, lease))
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptFileError(f"snapshot malformed: {exc}") from exc
    return revision, entries


def snapshot_revision(path: str) -> int | None:
    """The revision in a snapshot's header (None if absent or unreadable)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_SNAP_HEAD.size)
    except FileNotFoundError:
        return None
    if len(head) < _SNAP_HEAD.size:
        return None
    magic, _version, revision, _count = _SNAP_HEAD.unpack(head)
    return int(revision) if magic == SNAP_MAGIC else None


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: temp file, fsync, rename, fsync the directory."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def read_file(path: str) -> tuple[bytes, os.stat_result] | None:
    """The whole file and its stat (taken from the same open file), or None if absent."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        chunks: list[bytes] = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks), st
    finally:
        os.close(fd)
