"""Shared objects: one object per flush cycle holding many partitions' segments
(docs/format.md, "Shared objects").

A shared object is ``{namespace}/@shared/{name}``: a directory (``KFSO``, its length, and
JSON naming each segment's partition, writer epoch, base offset and byte range, offsets
counted from the end of the directory), then each partition's KAFS segment back to back.
A manifest entry names its segment inside with the object name ``~{name}#{off}+{length}``
under its partition prefix, so the segment's key as every reader builds it is
``{namespace}/{topic}/{partition}/~{name}#{off}+{length}``: a *range key*. The stores
resolve a range key to its object and byte range (``translate``) for ``get``,
``get_buffer``, ``get_parts`` and ``head``, and refuse to write or delete one. Readers
(the fetch path, merges, the ingest job, repair) need no other change.

A shared object is deleted by the shared sweep only (``broker.shared_sweep``), never by a
partition's retirement or sweep: other partitions' entries may still name it.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence

from protocol.values import value
from segments.names import DEFAULT_NAMESPACE
from segments.store import StoreError

MAGIC = b"KFSO"
HEAD = struct.Struct(">4sI")
SHARED_DIR = "@shared"
# a directory larger than this is read by a second GET (1,000 partitions: ~90 KB)
DIRECTORY_PROBE = 64 * 1024


class SharedFormatError(ValueError):
    """Not a shared object's directory."""


class RangeKeyError(StoreError, ValueError):
    """A malformed range key (a corrupt manifest entry): a store error like any other
    unreadable object, so that a request fails retriably instead of with a traceback."""


@value
class SharedRange:
    """One partition's segment inside a shared object."""

    topic: str
    topic_id: str  # hex of the topic incarnation's id
    partition: int
    epoch: int  # the writer's ownership epoch of the partition
    base: int  # the segment's first offset
    off: int  # byte offset of the segment in the object
    length: int
    object_name: str = ""  # the shared object's name (not stored in its directory)

    @property
    def entry_name(self) -> str:
        return entry_name_of(self.object_name, self.off, self.length)


def object_key(namespace: str, name: str) -> str:
    return f"{namespace or DEFAULT_NAMESPACE}/{SHARED_DIR}/{name}"


def prefix(namespace: str) -> str:
    return f"{namespace or DEFAULT_NAMESPACE}/{SHARED_DIR}/"


def object_name(broker_id: int, token: str, seq: int) -> str:
    """Writer-unique: the broker, a token drawn once per process, a number per cycle."""
    return f"{broker_id}-{token}-{seq:012d}.kfm"


def entry_name_of(name: str, off: int, length: int) -> str:
    """What a manifest entry records as its object name (``SegmentMeta.key``)."""
    return f"~{name}#{off}+{length}"


def is_range_key(key: str) -> bool:
    return "/~" in key


def resolve(key: str) -> tuple[str, int, int] | None:
    """``(object key, offset, length)`` of a range key; None for any other key."""
    i = key.rfind("/~")
    if i < 0:
        return None
    head, tail = key[:i], key[i + 2 :]
    name, sep, span = tail.rpartition("#")
    off, plus, length = span.partition("+")
    parts = head.rsplit("/", 2)
    if not sep or not plus or not name or "/" in name or len(parts) != 3:
        raise RangeKeyError(f"malformed range key {key!r}")
    try:
        lo, n = int(off), int(length)
    except ValueError:
        raise RangeKeyError(f"malformed range key {key!r}") from None
    if lo < 0 or n < 0:
        raise RangeKeyError(f"malformed range key {key!r}")
    return f"{parts[0]}/{SHARED_DIR}/{name}", lo, n


def translate(key: str, start: int | None, end: int | None) -> tuple[str, int | None, int | None]:
    """``(key, start, end)`` of a read as the store sees it: a range key's bytes
    ``[start, end)`` (relative, clamped to the range) in its shared object; any other
    key unchanged."""
    r = resolve(key)
    if r is None:
        return key, start, end
    obj, off, length = r
    lo = min(length, max(0, start or 0))
    hi = length if end is None else min(length, max(lo, end))
    return obj, off + lo, off + hi


def directory(ranges: Sequence[SharedRange]) -> bytes:
    """The object's head: ``KFSO``, the JSON's length, the JSON. ``ranges``' offsets are
    counted from the end of the head (the first segment's is 0)."""
    body = json.dumps(
        {
            "v": 1,
            "segments": [
                [r.topic, r.topic_id, r.partition, r.epoch, r.base, r.off, r.length] for r in ranges
            ],
        },
        separators=(",", ":"),
    ).encode()
    return HEAD.pack(MAGIC, len(body)) + body


def directory_size(head: bytes) -> int:
    """The full directory's size in bytes from the first ``HEAD.size`` of the object."""
    if len(head) < HEAD.size:
        raise SharedFormatError("object shorter than a shared object's head")
    magic, n = HEAD.unpack_from(head)
    if magic != MAGIC:
        raise SharedFormatError(f"not a shared object (magic {magic!r})")
    return HEAD.size + n


def parse_directory(name: str, data: bytes) -> list[SharedRange]:
    """The segments a shared object holds, from its first ``directory_size`` bytes."""
    size = directory_size(data)
    if len(data) < size:
        raise SharedFormatError("shared object directory cut short")
    try:
        doc = json.loads(bytes(data[HEAD.size : size]))
        return [  # offsets in the object
            SharedRange(str(t), str(tid), int(p), int(e), int(b), size + int(o), int(n), name)
            for t, tid, p, e, b, o, n in doc["segments"]
        ]
    except (ValueError, KeyError, TypeError) as exc:
        raise SharedFormatError(f"bad shared object directory: {exc}") from None
