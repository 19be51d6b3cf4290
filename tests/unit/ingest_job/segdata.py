"""Test data for the ingest job: real KAFS segments in a real store + a real manifest.

Segments are framed with ``segments.writer.build_segment`` from batches built with
``protocol.records.build_batch`` and written through the real ``ObjectStore``; manifest
entries and log ends are written to a real ``MetaStore`` with the broker's key layout.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from broker.meta.base import MetaStore
from broker.meta.schema import TopicInfo, topic_key
from protocol.records import build_batch
from segments.format import SEGMENT_VERSION, index_key_for, segment_key
from segments.store import Buffer, ObjectStore
from segments.writer import build_segment

BASE_TS = 1_763_769_600_000  # 2025-11-22T00:00:00Z


@dataclass(frozen=True, slots=True)
class Rec:
    topic: str
    partition: int
    offset: int
    timestamp: int  # ms
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def json_value(topic: str, partition: int, offset: int) -> bytes:
    return json.dumps(
        {"id": offset, "topic_name": topic, "amount": offset * 1.5, "ok": offset % 2 == 0}
    ).encode()


async def create_topic(meta: MetaStore, topic: str, partitions: int) -> None:
    info = TopicInfo(topic, uuid.uuid5(uuid.NAMESPACE_URL, topic), partitions, {})
    await meta.put(topic_key(topic), info.to_json())


@dataclass(slots=True)
class PartitionWriter:
    """Appends segments to one partition: object first, then manifest entry + log end."""

    store: ObjectStore
    meta: MetaStore
    topic: str
    partition: int
    namespace: str = "default"
    next_offset: int = 0

    async def append(
        self,
        values: Sequence[bytes | None],
        compression: int = 0,
        batch_size: int = 50,
        hour_step_ms: int = 0,
        commit: bool = True,
        mangle: Callable[[bytearray], bytes] | None = None,
        version: int = SEGMENT_VERSION,
    ) -> list[Rec]:
        """One segment holding ``values`` (in batches); returns the records written.
        ``version`` 1 writes the legacy layout (its index a separate object beside it)."""
        base = self.next_offset
        batches: list[memoryview] = []
        out: list[Rec] = []
        for i in range(0, len(values), batch_size):
            chunk = values[i : i + batch_size]
            off0 = base + i
            recs = []
            tss = []
            for j, v in enumerate(chunk):
                off = off0 + j
                key = None if off % 7 == 0 else f"k{off}".encode()
                headers = (("h", f"v{off}".encode()),) if off % 3 else ()
                ts = BASE_TS + off * 1000 + off * hour_step_ms
                recs.append((key, v, list(headers)))
                tss.append(ts)
                out.append(Rec(self.topic, self.partition, off, ts, key, v, headers))
            batch = build_batch(recs, base_offset=off0, compression=compression, timestamps=tss)
            batches.append(memoryview(batch))
        seg = build_segment(base, batches, version=version)
        obj_key = segment_key(self.namespace, self.topic, self.partition, base)
        if version == 1:
            await self.store.put_if_absent(index_key_for(obj_key), [seg.index])
        buffers: Sequence[Buffer] = seg.buffers
        if mangle is not None:  # a segment written corrupt (its manifest ETag matches)
            buffers = [mangle(bytearray(b"".join(bytes(b) for b in seg.buffers)))]
        etag = await self.store.put_if_absent(obj_key, buffers)
        self.next_offset = seg.last_offset + 1
        if commit:
            await self.commit_entry(base, seg.last_offset, seg.size, seg.record_count, etag)
        return out

    async def commit_entry(self, base: int, last: int, size: int, records: int, etag: str) -> None:
        entry = {
            "base": base,
            "last": last,
            "bytes": size,
            "records": records,
            "max_ts": 0,
            "etag": etag,
        }
        prefix = f"/logs/{self.topic}/{self.partition}"
        await self.meta.put(f"{prefix}/segments/{base:020d}", json.dumps(entry).encode())
        end = {"next_offset": last + 1, "epoch": 1}
        await self.meta.put(f"{prefix}/end", json.dumps(end).encode())


def values_for(topic: str, partition: int, start: int, n: int) -> list[bytes | None]:
    return [json_value(topic, partition, start + i) for i in range(n)]


def rows_of(table_rows: Sequence[dict[str, object]]) -> list[Rec]:
    """Records from rows read back (pyiceberg / DuckDB dicts), sorted."""
    out = []
    for r in table_rows:
        ts = r["timestamp"]
        ms = int(ts.timestamp() * 1000) if hasattr(ts, "timestamp") else int(ts) // 1000  # type: ignore[call-overload]
        hdrs = tuple((h["key"], h["value"]) for h in (r.get("headers") or []))  # type: ignore[attr-defined]
        out.append(
            Rec(
                str(r["topic"]),
                int(r["partition"]),  # type: ignore[call-overload]
                int(r["offset"]),  # type: ignore[call-overload]
                ms,
                _b(r["key"]),
                _b(r["value"]),
                hdrs,
            )
        )
    return sorted(out, key=lambda x: (x.topic, x.partition, x.offset))


def _b(v: object) -> bytes | None:
    if v is None:
        return None
    return bytes(v)  # type: ignore[call-overload]
