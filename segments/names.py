"""Object keys of segments and indexes, and writer-unique object names (docs/format.md,
"Object keys"). No I/O, no format parsing: what a key says, and how to build one.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

DEFAULT_NAMESPACE = "default"
SEGMENT_SUFFIX = ".kfs"
INDEX_SUFFIX = ".index"


def partition_prefix(namespace: str, topic: str, partition: int) -> str:
    """``{namespace}/{topic}/{partition}/`` (with the trailing slash)."""
    return f"{namespace or DEFAULT_NAMESPACE}/{topic}/{partition}/"


def segment_key(namespace: str, topic: str, partition: int, base_offset: int) -> str:
    return f"{partition_prefix(namespace, topic, partition)}segment-{base_offset:020d}.kfs"


def index_key(namespace: str, topic: str, partition: int, base_offset: int) -> str:
    return f"{partition_prefix(namespace, topic, partition)}segment-{base_offset:020d}.index"


def index_key_for(segment_key_: str) -> str:
    """The index key beside a segment key (``.kfs`` -> ``.index``)."""
    if not segment_key_.endswith(SEGMENT_SUFFIX):
        raise ValueError(f"not a segment key: {segment_key_!r}")
    return segment_key_[: -len(SEGMENT_SUFFIX)] + INDEX_SUFFIX


def base_offset_of_key(key: str) -> int:
    """Parse the base offset out of a segment or index key (any naming scheme)."""
    parsed = parse_object_name(key.rsplit("/", 1)[-1])
    if parsed is None:
        raise ValueError(f"not a segment key: {key!r}")
    return parsed.base


@dataclass(frozen=True, slots=True)
class ObjectName:
    """What a segment or index object's name says (docs/format.md, "Object keys").

    Writer-unique names (everything written since this scheme) carry the writer's
    ownership ``epoch``, a ``topic_tag`` (the first 8 hex digits of the topic id) and a
    per-writer ``seq``; legacy names (``segment-{base}.kfs``, ``segment-{base}-{last}.kfs``)
    carry neither and have ``epoch`` None.
    """

    base: int
    last: int | None
    epoch: int | None = None
    topic_tag: str = ""
    seq: int = -1
    index: bool = False


def topic_tag(topic_id: uuid.UUID) -> str:
    """The topic-id component of writer-unique object names."""
    return topic_id.hex[:8]


def object_name(base: int, last: int, epoch: int, topic_id: uuid.UUID, seq: int) -> str:
    """A writer-unique segment object name (under ``{ns}/{topic}/{partition}/``): only the
    owner of the partition at ``epoch`` (of that topic incarnation) writes it, once."""
    return tagged_object_name(base, last, epoch, topic_tag(topic_id), seq)


def tagged_object_name(base: int, last: int, epoch: int, tag: str, seq: int) -> str:
    """``object_name`` with the topic's ``topic_tag`` given (a partition's, kept)."""
    return f"segment-{base:020d}-{last:020d}-e{epoch:010d}-{tag}-{seq:012d}{SEGMENT_SUFFIX}"


def parse_object_name(name: str) -> ObjectName | None:
    """Parse ``segment-...{.kfs|.index}`` (either scheme); None for anything else."""
    for suffix, index in ((SEGMENT_SUFFIX, False), (INDEX_SUFFIX, True)):
        if not (name.startswith("segment-") and name.endswith(suffix)):
            continue
        parts = name[len("segment-") : -len(suffix)].split("-")
        if not all(len(p) == 20 and p.isdigit() for p in parts[:2]):
            return None
        if len(parts) in (1, 2):
            return ObjectName(
                int(parts[0]), int(parts[1]) if len(parts) == 2 else None, index=index
            )
        if len(parts) != 5:
            return None
        epoch, tag, seq = parts[2:]
        if not (
            epoch.startswith("e")
            and epoch[1:].isdigit()
            and len(tag) == 8
            and all(c in "0123456789abcdef" for c in tag)
            and seq.isdigit()
        ):
            return None
        return ObjectName(int(parts[0]), int(parts[1]), int(epoch[1:]), tag, int(seq), index)
    return None
