"""The KAFS segment validator (docs/format.md): ``validate_segment`` checks a whole
segment and its sparse index and never raises for corruption: it returns a
``SegmentReport`` whose ``problems`` list names every defect found (empty when valid);
``SegmentReport.raise_if_corrupt()`` turns the first problems into a
``CorruptSegmentError``. Used by the broker's repair, ``kafscale segments inspect``, the
ingest job and the tests.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from protocol.batch import BatchHeader, CorruptBatchError, crc32c, verify_crc
from segments.format import (
    FOOTER_SIZE,
    HEADER_SIZE,
    SEGMENT_VERSION,
    CorruptSegmentError,
    IndexEntry,
    SegmentFooter,
    SegmentHeader,
    body_end,
    iter_segment_batches,
    parse_footer,
    parse_header,
    parse_index,
    parse_index_header,
)
from segments.store import Buffer


@dataclass(frozen=True, slots=True)
class BatchSummary:
    position: int  # byte position of the batch start in the segment file
    base_offset: int
    last_offset: int
    record_count: int
    size: int
    compression: int
    max_timestamp: int
    crc_ok: bool
    # "data", "txn" (transactional data), or a control batch's "COMMIT"/"ABORT" marker
    kind: str = "data"
    producer_id: int = -1
    producer_epoch: int = -1


@dataclass(slots=True)
class SegmentReport:
    header: SegmentHeader | None
    footer: SegmentFooter | None
    batches: list[BatchSummary] = field(default_factory=list)
    index: list[IndexEntry] | None = None
    index_interval: int | None = None
    body_crc: int | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_if_corrupt(self) -> None:
        if self.problems:
            raise CorruptSegmentError("; ".join(self.problems[:5]))


def batch_kind(hdr: BatchHeader, view: memoryview) -> str:
    """``data``, ``txn`` (transactional data) or the marker of a control batch
    (``COMMIT``/``ABORT``; key = version int16 + type int16, docs/architecture.md)."""
    if not hdr.is_control:
        return "txn" if hdr.is_transactional else "data"
    from protocol.records import decode_batch

    try:
        key = decode_batch(view)[1][0].key or b""
    except Exception:  # noqa: BLE001 - a report, not a reader: name it unknown
        return "CONTROL?"
    kind = struct.unpack_from(">h", key, 2)[0] if len(key) >= 4 else -1
    return {0: "ABORT", 1: "COMMIT"}.get(kind, "CONTROL?")


# ---------------------------------------------------------------------------- validator


def _check_batches(data: Buffer, report: SegmentReport) -> None:
    hdr = report.header
    expected = hdr.base_offset if hdr is not None else None
    compacted = hdr is not None and hdr.compacted
    records = 0
    try:
        for pos, bh, view in iter_segment_batches(data):
            crc_ok = verify_crc(view, bh)
            report.batches.append(
                BatchSummary(
                    pos, bh.base_offset, bh.last_offset, bh.record_count, bh.size,
                    bh.compression, bh.max_timestamp, crc_ok,
                    batch_kind(bh, view), bh.producer_id, bh.producer_epoch,
                )
            )  # fmt: skip
            if not crc_ok:
                report.problems.append(
                    f"batch at byte {pos} (offset {bh.base_offset}) fails its CRC-32C"
                )
            if expected is not None and (
                bh.base_offset < expected if compacted else bh.base_offset != expected
            ):
                report.problems.append(
                    f"batch at byte {pos} has base offset {bh.base_offset}, expected {expected}"
                )
            if bh.last_offset_delta < 0 or bh.record_count < 0:
                report.problems.append(f"batch at byte {pos} has negative counts")
            expected = bh.last_offset + 1
            records += bh.record_count
    except (CorruptSegmentError, CorruptBatchError) as exc:
        report.problems.append(str(exc))
        return
    if not report.batches and not compacted:
        report.problems.append("segment body holds no record batch")
    if hdr is not None and records != hdr.record_count:
        report.problems.append(
            f"header record count {hdr.record_count} != {records} records in the batches"
        )
    ftr = report.footer
    if compacted and ftr is not None and report.batches:
        if ftr.last_offset < report.batches[-1].last_offset:
            report.problems.append(
                f"footer last offset {ftr.last_offset} < last batch's last offset "
                f"{report.batches[-1].last_offset}"
            )
    elif ftr is not None and report.batches and ftr.last_offset != report.batches[-1].last_offset:
        report.problems.append(
            f"footer last offset {ftr.last_offset} != last batch's last offset "
            f"{report.batches[-1].last_offset}"
        )


def _check_index(index: Buffer, report: SegmentReport) -> None:
    try:
        _, report.index_interval = parse_index_header(index)
        report.index = parse_index(index)
    except CorruptSegmentError as exc:
        report.problems.append(str(exc))
        return
    starts = {b.position: b.base_offset for b in report.batches}
    if not report.index and report.batches:
        report.problems.append("index has no entries (the first batch must be indexed)")
    elif report.batches and report.index[0].position != report.batches[0].position:
        report.problems.append("index does not start at the first batch")
    for entry in report.index:
        if starts.get(entry.position) != entry.offset:
            report.problems.append(
                f"index entry (offset {entry.offset}, position {entry.position}) "
                "does not point at the start of that batch"
            )


def validate_segment(data: Buffer, index: Buffer | None = None) -> SegmentReport:
    """Check a whole segment and its index: the trailer of a version 2 segment, ``index``
    (a separate index object) when given; see the module doc for the contract."""
    report = SegmentReport(header=None, footer=None)
    if len(data) < HEADER_SIZE + FOOTER_SIZE:
        report.problems.append(
            f"segment truncated: {len(data)} bytes, less than header + footer "
            f"({HEADER_SIZE + FOOTER_SIZE})"
        )
        return report
    try:
        report.header = parse_header(data)
    except CorruptSegmentError as exc:
        report.problems.append(str(exc))
    try:
        report.footer = parse_footer(data)
    except CorruptSegmentError as exc:
        report.problems.append(str(exc))
    try:
        end = body_end(data)
    except CorruptSegmentError as exc:
        report.problems.append(str(exc))
        return report
    body = memoryview(data)[HEADER_SIZE:end]
    report.body_crc = crc32c(body)
    if report.footer is not None and report.footer.body_crc != report.body_crc:
        report.problems.append(
            f"body CRC-32C mismatch: footer says 0x{report.footer.body_crc:08X}, "
            f"body is 0x{report.body_crc:08X}"
        )
    _check_batches(data, report)
    if end < len(data) - FOOTER_SIZE:
        _check_index(memoryview(data)[end : len(data) - FOOTER_SIZE], report)
    elif report.header is not None and report.header.version >= SEGMENT_VERSION:
        report.problems.append("version 2 segment without its index trailer")
    if index is not None:
        _check_index(index, report)
    return report
