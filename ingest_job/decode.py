"""Kafka v2 record batches -> Arrow columns (the ingest job's hot path).

The records of many batches (a whole segment) are decoded in one call of
:func:`protocol.fastrecords.decode_buffers` (native when the extension is built) straight
into Arrow buffers, wrapped without per-record Python into one ``pyarrow.RecordBatch`` of
exactly :data:`RAW_SCHEMA`. Control batches (transaction markers) carry no data and are
skipped. Header keys that are not UTF-8 are kept with U+FFFD replacements.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from protocol.batch import BATCH_HEADER_SIZE, BatchHeader, verify_crc
from protocol.compression import decompress
from protocol.errors import KafkaProtocolError
from protocol.fastrecords import BatchInput, RecordBuffers, decode_buffers
from protocol.records import Buf

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


#: (header, whole batch view) as ``segments.format.iter_segment_batches`` yields them
BatchRef = tuple[BatchHeader, memoryview]


@dataclass(slots=True)
class Columns:
    """The decoded records of one (topic, partition), as Arrow record batches."""

    topic: str
    partition: int
    batches: list[pa.RecordBatch] = field(default_factory=list)

    def __len__(self) -> int:
        return sum(b.num_rows for b in self.batches)

    def to_table(self) -> pa.Table:
        """All records as one table (no copy: one chunk per decoded call)."""
        return pa.Table.from_batches(self.batches, schema=RAW_SCHEMA)

    def to_arrow(self) -> pa.RecordBatch:
        """All records as one record batch (concatenated when there are several)."""
        if len(self.batches) == 1:
            return self.batches[0]
        if not self.batches:
            return pa.RecordBatch.from_pylist([], schema=RAW_SCHEMA)
        return pa.concat_batches(self.batches)


def _binary(
    kind: pa.DataType, n: int, validity: bytes | None, offsets: bytes, data: bytes, nulls: int
) -> pa.Array:
    buf = pa.py_buffer
    bitmap = buf(validity) if validity is not None else None
    return pa.Array.from_buffers(kind, n, [bitmap, buf(offsets), buf(data)], null_count=nulls)


def record_batch(topic: str, partition: int, rb: RecordBuffers) -> pa.RecordBatch:
    """One Arrow batch of :data:`RAW_SCHEMA` over the decoder's buffers (no per-row work)."""
    n, h, buf = rb.count, rb.header_count, pa.py_buffer
    ts_ms = pa.Array.from_buffers(pa.int64(), n, [None, buf(rb.timestamps)])
    hstruct = pa.StructArray.from_arrays(
        [
            _binary(pa.string(), h, None, rb.header_key_offsets, rb.header_key_data, 0),
            _binary(
                pa.binary(),
                h,
                rb.header_value_validity,
                rb.header_value_offsets,
                rb.header_value_data,
                rb.header_value_nulls,
            ),
        ],
        fields=list(HEADER_TYPE),
    )
    headers = pa.ListArray.from_arrays(
        pa.Array.from_buffers(pa.int32(), n + 1, [None, buf(rb.header_offsets)]),
        hstruct,
        type=RAW_SCHEMA.field("headers").type,
    )
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            pa.Array.from_buffers(pa.int64(), n, [None, buf(rb.offsets)]),
            pc.multiply(ts_ms, 1000).cast(TIMESTAMP_TYPE),
            pa.Array.from_buffers(pa.int32(), n, [None, buf(rb.timestamp_types)]),
            _binary(pa.binary(), n, rb.key_validity, rb.key_offsets, rb.key_data, rb.key_nulls),
            _binary(
                pa.binary(),
                n,
                rb.value_validity,
                rb.value_offsets,
                rb.value_data,
                rb.value_nulls,
            ),
            headers,
        ],
        schema=RAW_SCHEMA,
    )


def _records_of(hdr: BatchHeader, batch: memoryview) -> Buf:
    """The decompressed records section (a view into ``batch`` when uncompressed)."""
    body = batch[BATCH_HEADER_SIZE : hdr.size]
    codec = hdr.compression
    try:
        return decompress(codec, body) if codec else body
    except (ValueError, KafkaProtocolError) as exc:
        raise RecordDecodeError(
            f"record batch at offset {hdr.base_offset}: cannot decode records ({exc})"
        ) from exc


def _name_bad_batch(sections: list[BatchInput], start: int, end: int) -> RecordDecodeError:
    """Re-decode batch by batch (only after a failure) to name the offending batch."""
    for section, hdr in sections:
        try:
            decode_buffers([(section, hdr)], start, end, strict_utf8=False)
        except KafkaProtocolError as exc:
            return RecordDecodeError(
                f"record batch at offset {hdr.base_offset}: cannot decode records ({exc})"
            )
    return RecordDecodeError("cannot decode records")


def decode_batches_into(cols: Columns, batches: Iterable[BatchRef], start: int, end: int) -> int:
    """Append the records with ``start <= offset < end`` of many batches in one decoder
    call (CRCs already checked); returns how many. Control batches are skipped.

    Raises RecordDecodeError naming the bad batch's base offset.
    """
    sections: list[BatchInput] = [
        (_records_of(hdr, view), hdr)
        for hdr, view in batches
        if not hdr.is_control and hdr.record_count != 0
    ]
    if not sections:
        return 0
    try:
        decoded = decode_buffers(sections, start, end, strict_utf8=False)
    except KafkaProtocolError:
        raise _name_bad_batch(sections, start, end) from None
    added = 0
    for rb in decoded:
        if rb.count:
            cols.batches.append(record_batch(cols.topic, cols.partition, rb))
            added += rb.count
    return added


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
    return decode_batches_into(cols, [(hdr, batch)], start, end)
