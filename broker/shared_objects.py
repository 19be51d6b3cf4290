"""The flush cycle's shared object: many partitions' segments in one PUT (docs/format.md,
"Shared objects"; ``segments/shared.py``).

With ``--shared-objects-min-partitions N`` a flush cycle that has small segments (below
``--merge-small-bytes``) of at least N partitions writes them as one object instead of
one each: the directory, then the segments back to back, under a writer-unique name.
Each partition's manifest entry then names its byte range (a range key), and the cycle's
commit is the same as before: one guarded entry and end per partition, so what an
acknowledgement depends on is unchanged (the object's PUT, then the partition's own
guarded commit). The one PUT succeeds or fails for every partition in it.

A shared object is never deleted through a partition: a PUT that failed is deleted here
(nothing can name it), and every other one by the shared sweep (``broker.shared_sweep``),
once no entry names any of its segments and none can any more.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from protocol.batch import crc32c
from protocol.crc32c_combine import crc32c_combine
from segments.format import partition_prefix
from segments.shared import SharedRange, directory, entry_name_of, object_key, object_name
from segments.store import PutItem, StoreError

if TYPE_CHECKING:
    from broker.flush import Built, Job
    from broker.logs import LogManager

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SharedPut:
    """A cycle's shared object, ready for its PUT."""

    key: str
    item: PutItem
    # the jobs' segments as the commit names them: range keys for the shared ones
    built: list[Built | BaseException]


class SharedWriter:
    """Places a cycle's segments in one shared object (``Flusher._upload_all``)."""

    def __init__(self, logs: LogManager) -> None:
        self.logs = logs
        self.token = secrets.token_hex(6)  # writer-unique names with the node id and seq
        self.seq = 0

    def place(
        self, jobs: Sequence[Job], built: Sequence[Built | BaseException]
    ) -> SharedPut | None:
        """One object for the cycle's small segments (below ``--merge-small-bytes``: a
        large one gains nothing from sharing and keeps its own PUT), when there are at
        least ``--shared-objects-min-partitions`` of them: its key, its PUT (directory
        and segments, no copy of their bytes; the CRC-32C combined from theirs) and each
        segment's range key. None: every segment keeps its own object."""
        config = self.logs.config
        least = config.shared_objects_min_partitions
        small = [
            not isinstance(b, BaseException) and len(b.data) < config.merge_small_bytes
            for b in built
        ]
        if least <= 0 or sum(small) < max(2, least):
            return None
        self.seq += 1
        name = object_name(config.node_id, self.token, self.seq)
        ranges: list[SharedRange] = []
        off = 0
        for (lg, pend), b, share in zip(jobs, built, small, strict=True):
            if not share or isinstance(b, BaseException):
                continue
            size = len(b.data)
            base = pend[0].base_offset
            ranges.append(
                SharedRange(lg.topic, lg.topic_hex, lg.partition, lg.epoch, base, off, size)
            )
            off += size
        head = directory(ranges)
        crc = crc32c(head)
        placed: list[Built | BaseException] = []
        data: list[bytes] = []
        it = iter(ranges)
        for (lg, _pend), b, share in zip(jobs, built, small, strict=True):
            if not share or isinstance(b, BaseException):
                placed.append(b)
                continue
            r = next(it)
            entry = entry_name_of(name, len(head) + r.off, r.length)
            prefix = partition_prefix(config.namespace, lg.topic, lg.partition)
            placed.append(b._replace(name=entry, key=prefix + entry))
            crc = crc32c_combine(crc, b.segment.crc32c, r.length)
            data.append(b.data)
        key = object_key(config.namespace, name)
        return SharedPut(key, PutItem(key, [head, *data], crc), placed)

    async def discard(self, put: SharedPut) -> None:
        """Delete a shared object whose PUT failed: its name is ours alone and no entry
        names it (a later sweep collects it if this fails too)."""
        try:
            await self.logs.store.delete(put.key)
        except StoreError as exc:
            log.warning("could not delete uncommitted shared object %s: %s", put.key, exc)
