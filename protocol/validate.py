"""Produce-side validation of Kafka v2 record batches (no I/O), as Kafka's LogValidator.

Every batch a client sends is checked before the broker acknowledges it:

- framing, magic 2 and the CRC-32C (``CORRUPT_MESSAGE``);
- the header against the records actually present: ``recordsCount > 0``,
  ``lastOffsetDelta == recordsCount - 1``, exactly ``recordsCount`` well-formed records
  whose offset deltas are 0..n-1 and whose fields fill each record's length, and no
  trailing bytes. Compressed batches are decompressed for this (one pass into a reusable
  buffer that can never grow past ``max_uncompressed``: a decompression bomb is
  ``CORRUPT_MESSAGE`` after at most that many bytes), since no cheaper check proves the
  same thing (``INVALID_RECORD``);
- producer fields consistent with the flags: a producer id of -1 or >= 0; with a producer
  id, an epoch and a base sequence >= 0 (``INVALID_RECORD``);
- control batches are refused (only partition owners write them, for the transaction
  coordinator), and transactional batches need a producer id (``INVALID_RECORD``);
- timestamps (CreateTime topics) within ``message.timestamp.before.max.ms`` /
  ``after.max.ms`` (and the older ``difference.max.ms``) of the broker's clock
  (``INVALID_TIMESTAMP``).

The batch's ``maxTimestamp`` is recomputed from its records, as Kafka does, not trusted
from the header: :func:`validate_batch` returns the header to append, and when the header
lied it rewrites ``maxTimestamp`` in place and recomputes the CRC (the one re-encode the
write path allows). LogAppendTime topics are stamped by the caller instead.
"""

from __future__ import annotations

import dataclasses
import mmap
import struct
from dataclasses import dataclass

from protocol.batch import (
    BATCH_HEADER_SIZE,
    COMPRESSION_MASK,
    CRC_START,
    BatchHeader,
    crc32c,
    verify_crc,
)
from protocol.compression import decompress_into
from protocol.errors import ErrorCode, KafkaProtocolError
from protocol.fastrecords import native  # None without the C extension (or pure Python)

# an extension built before ``scan`` existed (not rebuilt yet) still decodes; scan in Python
native_scan = getattr(native, "scan", None)

LONG_MAX = (1 << 63) - 1
NO_TIMESTAMP = -1


class BatchRejected(Exception):
    """A batch that must not be appended: the Kafka error, a message and, when one record
    is to blame, its index within the batch (KIP-467 ``record_errors``)."""

    def __init__(self, code: ErrorCode, message: str, record_index: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.record_index = record_index


@dataclass(frozen=True, slots=True)
class TimestampPolicy:
    """A topic's timestamp rules (``message.timestamp.*``); bounds in ms, LONG_MAX = none."""

    log_append_time: bool = False
    before_max_ms: int = LONG_MAX
    after_max_ms: int = LONG_MAX

    @classmethod
    def from_configs(cls, configs: dict[str, str]) -> TimestampPolicy:
        diff = int(configs.get("message.timestamp.difference.max.ms", LONG_MAX))
        before = int(configs.get("message.timestamp.before.max.ms", LONG_MAX))
        after = int(configs.get("message.timestamp.after.max.ms", LONG_MAX))
        return cls(
            configs.get("message.timestamp.type") == "LogAppendTime",
            min(before, diff),
            min(after, diff),
        )


#: the default: what a produce of a topic without message.timestamp.* configs gets
DEFAULT_POLICY = TimestampPolicy()

#: a compressed batch may decompress to at least this much (more for topics with a large
#: max.message.bytes: the broker allows 4x that)
MIN_DECOMPRESSED_BOUND = 64 << 20


def decompressed_bound(max_message_bytes: int) -> int:
    return max(MIN_DECOMPRESSED_BOUND, 4 * max_message_bytes)


class _Scratch:
    """One reusable output buffer for decompressing batches on validation: an anonymous
    mapping, so only the pages a batch actually fills become resident; after a large
    one they are given back. Validation runs on the event loop thread, one batch at a
    time, and nothing keeps a view past :func:`validate_batch`."""

    RELEASE_ABOVE = 16 << 20

    def __init__(self) -> None:
        self._map: mmap.mmap | None = None

    def get(self, size: int) -> memoryview:
        if self._map is None or len(self._map) < size:
            if self._map is not None:
                try:
                    self._map.close()
                except BufferError:  # a view still alive somewhere: let GC unmap it
                    pass
            self._map = mmap.mmap(-1, size)
        return memoryview(self._map)[:size]

    def done(self, used: int) -> None:
        """``used`` bytes were written: give back the pages past RELEASE_ABOVE, if any."""
        m = self._map
        if m is not None and used > self.RELEASE_ABOVE:
            m.madvise(mmap.MADV_DONTNEED, self.RELEASE_ABOVE, len(m) - self.RELEASE_ABOVE)


_SCRATCH = _Scratch()


def _invalid(message: str, index: int | None = None) -> BatchRejected:
    return BatchRejected(ErrorCode.INVALID_RECORD, message, index)


def check_header(hdr: BatchHeader) -> None:
    """Header-only rules: counts, producer fields, control/transactional flags."""
    if hdr.is_control:
        raise _invalid("clients may not write control batches")
    if hdr.record_count <= 0:
        raise _invalid(f"invalid record count {hdr.record_count}")
    if hdr.last_offset_delta != hdr.record_count - 1:
        raise _invalid(
            f"last offset delta {hdr.last_offset_delta} does not match "
            f"record count {hdr.record_count}"
        )
    pid = hdr.producer_id
    if pid < -1:
        raise _invalid(f"invalid producer id {pid}")
    if hdr.is_transactional and pid < 0:
        raise _invalid("transactional batch without a producer id")
    if pid >= 0 and (hdr.producer_epoch < 0 or hdr.base_sequence < 0):
        raise _invalid(
            f"producer id {pid} with epoch {hdr.producer_epoch} "
            f"and base sequence {hdr.base_sequence}"
        )


def scan_records(section: bytes | bytearray | memoryview, count: int) -> tuple[int, int]:
    """(min, max) timestamp delta of a records section holding exactly ``count`` records
    with offset deltas 0..count-1; raises BatchRejected(INVALID_RECORD) otherwise."""
    if native_scan is not None:
        assert native is not None
        try:
            lo, hi = native_scan(section, count)
            return int(lo), int(hi)
        except native.CorruptRecords as exc:
            message, index = exc.args
            raise _invalid(str(message), int(index) if index < count else None) from None
    return _scan_python(bytes(section), count)


def _scan_python(data: bytes, count: int) -> tuple[int, int]:
    """:func:`scan_records` without the C extension (slower; same verdicts)."""
    from protocol.records import decode_records_section

    if count <= 0:
        raise _invalid("record count must be positive")
    hdr = BatchHeader(0, 0, 0, 2, 0, 0, count - 1, 0, 0, -1, -1, -1, count)
    try:
        offsets, stamps, _k, _v, _h = decode_records_section(data, hdr, "replace")
    except (IndexError, ValueError, struct.error, KafkaProtocolError) as exc:
        raise _invalid(f"malformed records: {exc}") from None
    if offsets != list(range(count)):
        bad = next(i for i, off in enumerate(offsets) if off != i)
        raise _invalid("record offset delta does not match its position in the batch", bad)
    return min(stamps), max(stamps)


def validate_batch(
    hdr: BatchHeader,
    view: memoryview,
    policy: TimestampPolicy = DEFAULT_POLICY,
    now_ms: int = 0,
    *,
    max_uncompressed: int = MIN_DECOMPRESSED_BOUND,
) -> BatchHeader:
    """Check one framed v2 batch (see the module doc). Returns the header to append:
    ``hdr`` itself, or a copy with the recomputed ``maxTimestamp`` (the batch bytes were
    then patched and re-checksummed in place). Raises BatchRejected."""
    if not verify_crc(view, hdr):
        raise BatchRejected(ErrorCode.CORRUPT_MESSAGE, "record batch CRC mismatch")
    check_header(hdr)
    body = view[BATCH_HEADER_SIZE : hdr.size]
    codec = hdr.attributes & COMPRESSION_MASK
    if codec:
        out = _SCRATCH.get(max_uncompressed)
        n = len(out)  # a failed decompression may have written up to all of it
        try:
            n = decompress_into(codec, body, out)
            lo, hi = scan_records(out[:n], hdr.record_count)
        except KafkaProtocolError as exc:
            raise BatchRejected(exc.code, exc.message or "cannot decompress") from None
        finally:
            out.release()
            _SCRATCH.done(n)
    else:
        lo, hi = scan_records(body, hdr.record_count)
    if policy.log_append_time:
        return hdr  # the caller stamps the batch with the append time
    first, last = hdr.base_timestamp + lo, hdr.base_timestamp + hi
    _check_timestamps(first, last, policy, now_ms)
    if last == hdr.max_timestamp:
        return hdr
    struct.pack_into(">q", view, 35, last)
    crc = crc32c(view[CRC_START : hdr.size])
    struct.pack_into(">I", view, 17, crc)
    return dataclasses.replace(hdr, max_timestamp=last, crc=crc)


def _check_timestamps(first: int, last: int, policy: TimestampPolicy, now_ms: int) -> None:
    if first < NO_TIMESTAMP or last > LONG_MAX:
        raise BatchRejected(ErrorCode.INVALID_TIMESTAMP, "record timestamp out of range")
    if policy.before_max_ms == LONG_MAX and policy.after_max_ms == LONG_MAX:
        return
    if first != NO_TIMESTAMP and now_ms - first > policy.before_max_ms:
        raise BatchRejected(
            ErrorCode.INVALID_TIMESTAMP,
            f"timestamp {first} is more than {policy.before_max_ms} ms before the broker time",
        )
    if last - now_ms > policy.after_max_ms:
        raise BatchRejected(
            ErrorCode.INVALID_TIMESTAMP,
            f"timestamp {last} is more than {policy.after_max_ms} ms after the broker time",
        )
