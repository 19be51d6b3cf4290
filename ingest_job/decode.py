"""Kafka v2 record batches -> Arrow columns (the ingest job's hot path).

Records are decoded straight into column lists (no per-record objects) and turned into
one ``pyarrow.RecordBatch`` per call, with exactly :data:`RAW_SCHEMA`. Batches are CRC
checked; control batches (transaction markers) carry no data and are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from protocol.batch import BATCH_HEADER_SIZE, BatchHeader, CorruptBatchError, verify_crc
from protocol.compression import decompress
from protocol.errors import KafkaProtocolError

HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")

RAW_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", TIMESTAMP_TYPE),
        pa.field("timestamp_type", pa.int32()),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", pa.list_(pa.field("element", HEADER_TYPE))),
    ]
)

#: the same schema as a Spark DDL string (the ``kafs`` data source declares it)
SPARK_DDL = (
    "topic string, partition int, offset bigint, timestamp timestamp, timestamp_type int, "
    "key binary, value binary, headers array<struct<key:string,value:binary>>"
)


class RecordDecodeError(ValueError):
    """A batch whose CRC or record framing is wrong (message names the offset)."""


#: zig-zag decode of every one-byte varint
_ZZ = tuple((b >> 1) ^ -(b & 1) for b in range(128))


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """Zig-zag varint at ``pos``: (value, new position)."""
    shift = 0
    raw = 0
    while True:
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7
        if shift > 63:
            raise RecordDecodeError("varint too long")


@dataclass(slots=True)
class Columns:
    """Column lists being filled for one (topic, partition)."""

    topic: str
    partition: int
    offsets: list[int] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)  # ms
    ts_types: list[int] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    header_offsets: list[int] = field(default_factory=lambda: [0])
    header_keys: list[str] = field(default_factory=list)
    header_values: list[bytes | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.offsets)

    def to_arrow(self) -> pa.RecordBatch:
        n = len(self.offsets)
        ts = pa.array(self.timestamps, pa.int64())
        ts_us = pc.multiply(ts, 1000).cast(TIMESTAMP_TYPE)
        hstruct = pa.StructArray.from_arrays(
            [pa.array(self.header_keys, pa.string()), pa.array(self.header_values, pa.binary())],
            fields=list(HEADER_TYPE),
        )
        headers = pa.ListArray.from_arrays(
            pa.array(self.header_offsets, pa.int32()),
            hstruct,
            type=RAW_SCHEMA.field("headers").type,
        )
        return pa.RecordBatch.from_arrays(
            [
                pa.array([self.topic] * n, pa.string()),
                pa.array([self.partition] * n, pa.int32()),
                pa.array(self.offsets, pa.int64()),
                ts_us,
                pa.array(self.ts_types, pa.int32()),
                pa.array(self.keys, pa.binary()),
                pa.array(self.values, pa.binary()),
                headers,
            ],
            schema=RAW_SCHEMA,
        )


def decode_batch_into(
    cols: Columns,
    hdr: BatchHeader,
    batch: memoryview,
    start: int,
    end: int,
    check_crc: bool = True,
) -> int:
    """Append the records of one batch with ``start <= offset < end``; returns how many.

    Raises RecordDecodeError naming the batch's base offset on a bad CRC or framing.
    """
    if check_crc and not verify_crc(batch, hdr):
        raise RecordDecodeError(f"record batch at offset {hdr.base_offset}: CRC-32C mismatch")
    if hdr.is_control or hdr.record_count == 0:
        return 0
    body: bytes | memoryview = batch[BATCH_HEADER_SIZE:]
    codec = hdr.compression
    try:
        buf = decompress(codec, body) if codec else bytes(body)
        return _decode_records(cols, hdr, buf, start, end)
    except (IndexError, ValueError, KafkaProtocolError) as exc:
        raise RecordDecodeError(
            f"record batch at offset {hdr.base_offset}: cannot decode records ({exc})"
        ) from exc


def _decode_records(cols: Columns, hdr: BatchHeader, buf: bytes, start: int, end: int) -> int:
    """The hot loop: one-byte varints (the common case) are decoded inline via ``_ZZ``."""
    base = hdr.base_offset
    ts_fixed = hdr.max_timestamp if hdr.timestamp_type == 1 else None
    base_ts = hdr.base_timestamp
    offsets, timestamps = cols.offsets, cols.timestamps
    keys, values = cols.keys, cols.values
    hoffs, hkeys, hvals = cols.header_offsets, cols.header_keys, cols.header_values
    zz = _ZZ
    varint = _varint
    pos = 0
    added = 0
    for _ in range(hdr.record_count):
        b = buf[pos]
        if b < 128:
            length = zz[b]
            pos += 1
        elif buf[pos + 1] < 128:  # two-byte varint
            raw = (b & 0x7F) | (buf[pos + 1] << 7)
            length = (raw >> 1) ^ -(raw & 1)
            pos += 2
        else:
            length, pos = varint(buf, pos)
        rec_end = pos + length
        b = buf[pos + 1]  # skip attributes
        if b < 128:
            ts_delta = zz[b]
            pos += 2
        else:
            ts_delta, pos = varint(buf, pos + 1)
        b = buf[pos]
        if b < 128:
            offset = base + zz[b]
            pos += 1
        else:
            delta, pos = varint(buf, pos)
            offset = base + delta
        if offset < start or offset >= end:
            pos = rec_end
            continue
        b = buf[pos]
        if b < 128:
            klen = zz[b]
            pos += 1
        else:
            klen, pos = varint(buf, pos)
        if klen >= 0:
            keys.append(buf[pos : pos + klen])
            pos += klen
        else:
            keys.append(None)
        b = buf[pos]
        if b < 128:
            vlen = zz[b]
            pos += 1
        elif buf[pos + 1] < 128:  # two-byte varint
            raw = (b & 0x7F) | (buf[pos + 1] << 7)
            vlen = (raw >> 1) ^ -(raw & 1)
            pos += 2
        else:
            vlen, pos = varint(buf, pos)
        if vlen >= 0:
            values.append(buf[pos : pos + vlen])
            pos += vlen
        else:
            values.append(None)
        b = buf[pos]
        if b == 0:
            pos += 1
        else:
            pos = _decode_headers(buf, pos, hkeys, hvals)
        hoffs.append(len(hkeys))
        if pos != rec_end:
            raise CorruptBatchError(f"record at offset {offset} overruns its length")
        offsets.append(offset)
        timestamps.append(ts_fixed if ts_fixed is not None else base_ts + ts_delta)
        added += 1
    cols.ts_types.extend([hdr.timestamp_type] * added)
    return added


def _decode_headers(buf: bytes, pos: int, hkeys: list[str], hvals: list[bytes | None]) -> int:
    nh, pos = _varint(buf, pos)
    for _h in range(nh):
        hk, pos = _varint(buf, pos)
        hkeys.append(buf[pos : pos + hk].decode("utf-8", "replace"))
        pos += hk
        hv, pos = _varint(buf, pos)
        if hv >= 0:
            hvals.append(buf[pos : pos + hv])
            pos += hv
        else:
            hvals.append(None)
    return pos
