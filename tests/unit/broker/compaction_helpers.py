"""Helpers of the log compaction tests (test_compaction_*.py): the compacted topic, one
committed batch per segment, and the records a partition reads back."""

from __future__ import annotations

from typing import Any

from broker.logs import LogManager
from broker.partition import PartitionLog
from protocol.batch import iter_batches, read_header
from protocol.errors import ErrorCode
from protocol.records import build_batch, decode_batch

TOPIC = "compacted"
COMPACT = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"}


async def append(logs: LogManager, recs: list[Any], **kw: Any) -> None:
    """One committed batch (= one segment)."""
    lg = await logs.get(TOPIC, 0)
    view = memoryview(bytearray(build_batch(recs, **kw)))
    res = lg.append(read_header(view), view)
    assert res.error == ErrorCode.NONE and res.done is not None
    logs.appended(lg, len(view))
    await res.done


async def read_records(
    logs: LogManager, lg: PartitionLog
) -> list[tuple[int, bytes | None, bytes | None]]:
    out: list[tuple[int, bytes | None, bytes | None]] = []
    offset = 0
    while offset < lg.hw:
        views = await logs.read(lg, offset, 1 << 20)
        if not views:
            break
        for v in views:
            for hdr, bv in iter_batches(v):
                out += [
                    (r.offset, r.key, r.value) for r in decode_batch(bv)[1] if r.offset >= offset
                ]
                offset = max(offset, hdr.last_offset + 1)
    return out
