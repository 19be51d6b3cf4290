"""``kafscale segments inspect PATH|URL``: print and validate one KAFS segment.

PATH is a local ``.kfs`` file; URL is ``file://PATH`` or
``s3://BUCKET/KEY.kfs?endpoint=URL&region=R[&access_key=..&secret_key=..]``. A segment
inside a shared object is named by its range key (``.../{partition}/~{name}#{off}+{len}``,
docs/format.md "Shared objects"), as a path or in the URL (its ``#`` written ``%23``). The index
is checked: a version 2 segment's trailer, or a version 1 segment's ``.index`` object
beside it when present (docs/format.md).

``--verify`` also decodes every batch (decompression included) and checks its header
against its records, as the broker does on produce (``protocol.validate``): a batch that
does not decode is printed as ``UNDECODABLE`` with the last offset before it that is
still good (``last good offset``), the offset to give ``kafscale partitions truncate``
(see docs/operations.md).

Exit status: 0 valid, 1 corrupt (each problem is printed), 2 unreadable / bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import sys
from typing import TextIO
from urllib.parse import unquote, urlsplit

from segments.format import INDEX_SUFFIX, SEGMENT_SUFFIX
from segments.shared import resolve
from segments.store import ObjectNotFoundError, StoreError
from segments.validate import SegmentReport, validate_segment

CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


def _index_name(name: str) -> str:
    return name[: -len(SEGMENT_SUFFIX)] + INDEX_SUFFIX if name.endswith(SEGMENT_SUFFIX) else ""


async def _load_s3(url: str) -> tuple[bytes, bytes | None]:
    from segments.s3_store import S3Store

    parts = urlsplit(url)
    key = unquote(parts.path.lstrip("/"))  # a range key's "#" is "%23" in a URL
    if not key:
        raise ValueError(f"no object key in {url!r}")
    store = S3Store.from_url(parts._replace(path="").geturl())
    try:
        data = await store.get(key)
        index = None
        if ikey := _index_name(key):
            try:
                index = await store.get(ikey)
            except ObjectNotFoundError:
                index = None
        return data, index
    finally:
        await store.close()


def _load_file(path: str) -> tuple[bytes, bytes | None]:
    if (span := resolve(path)) is not None:  # a segment inside a shared object
        obj, off, length = span
        with open(obj, "rb") as f:
            f.seek(off)
            return f.read(length), None
    with open(path, "rb") as f:
        data = f.read()
    index = None
    if ipath := _index_name(path):
        try:
            with open(ipath, "rb") as f:
                index = f.read()
        except FileNotFoundError:
            index = None
    return data, index


def load(target: str) -> tuple[bytes, bytes | None]:
    """The segment's bytes and its index's bytes (None when there is no index)."""
    if target.startswith("s3://"):
        return asyncio.run(_load_s3(target))
    if target.startswith("file://"):
        target = target[len("file://") :]
    return _load_file(target)


def _ms(ms: int) -> str:
    try:
        return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).isoformat(timespec="milliseconds")
    except (ValueError, OverflowError, OSError):
        return "invalid"


def print_report(target: str, size: int, report: SegmentReport, out: TextIO) -> None:
    w = out.write
    w(f"segment: {target} ({size} bytes)\n")
    if (h := report.header) is not None:
        w(
            f"header:  magic=KAFS version={h.version} flags=0x{h.flags:04x} "
            f"compression={CODECS.get(h.compression, h.compression)} base_offset={h.base_offset} "
            f"records={h.record_count} created={_ms(h.created_ms)} ({h.created_ms})"
            f"{' compacted (offsets have gaps)' if h.compacted else ''}\n"
        )
    if (f := report.footer) is not None:
        state = "ok" if f.body_crc == report.body_crc else f"MISMATCH, body 0x{report.body_crc:08x}"
        w(
            f"footer:  body_crc=0x{f.body_crc:08x} ({state}) "
            f"last_offset={f.last_offset} magic=END!\n"
        )
    if report.index is None:
        w("index:   none\n")
    else:
        inside = " (inside the segment)" if h is not None and h.index_length else ""
        w(
            f"index:   {len(report.index)} entries, interval {report.index_interval} records"
            f"{inside}\n"
        )
        for e in report.index:
            w(f"  offset={e.offset} position={e.position}\n")
    w(f"batches: {len(report.batches)}\n")
    w(f"  {'position':>10} {'base':>12} {'last':>12} {'records':>8} {'bytes':>9} codec   crc")
    w("  kind     producer\n")
    for b in report.batches:
        producer = f"{b.producer_id}/{b.producer_epoch}" if b.producer_id >= 0 else "-"
        w(
            f"  {b.position:>10} {b.base_offset:>12} {b.last_offset:>12} {b.record_count:>8} "
            f"{b.size:>9} {CODECS.get(b.compression, str(b.compression)):<7} "
            f"{'ok' if b.crc_ok else 'BAD':<4} {b.kind:<8} {producer}\n"
        )
    if report.ok:
        w("OK: segment is valid\n")
    else:
        for problem in report.problems:
            w(f"CORRUPT: {problem}\n")


def verify_batches(data: bytes, report: SegmentReport) -> list[tuple[int, int, str]]:
    """(position, base offset, problem) of every batch whose records do not decode."""
    from protocol.batch import BATCH_HEADER_SIZE, read_header
    from protocol.compression import decompress
    from protocol.errors import KafkaProtocolError
    from protocol.validate import BatchRejected, check_header, scan_records

    bad: list[tuple[int, int, str]] = []
    view = memoryview(data)
    for b in report.batches:
        batch = view[b.position : b.position + b.size]
        try:
            if report.header is not None and report.header.compacted:
                _verify_compacted(batch)  # records with gaps (docs/format.md)
                continue
            hdr = read_header(batch)
            check_header(hdr)
            body = batch[BATCH_HEADER_SIZE : hdr.size]
            if hdr.compression:
                body = memoryview(decompress(hdr.compression, body))
            scan_records(body, hdr.record_count)
        except (BatchRejected, KafkaProtocolError, ValueError) as exc:
            bad.append((b.position, b.base_offset, str(exc)))
    return bad


def _verify_compacted(batch: memoryview) -> None:
    """A batch rewritten by compaction: its records decode, their offsets ascend within
    the batch's range (gaps allowed); an empty batch holds no record. Raises ValueError."""
    from protocol.records import decode_batch_columns

    cols = decode_batch_columns(batch)
    hdr = cols.header
    if len(cols) != hdr.record_count:
        raise ValueError(f"{len(cols)} records, header says {hdr.record_count}")
    prev = hdr.base_offset - 1
    for off in cols.offsets:
        if not prev < off <= hdr.last_offset:
            raise ValueError(f"record offset {off} out of order or outside the batch")
        prev = off


def _print_verify(report: SegmentReport, bad: list[tuple[int, int, str]], out: TextIO) -> None:
    for position, base, problem in bad:
        out.write(f"UNDECODABLE: batch at position {position} (base offset {base}): {problem}\n")
    if bad:
        first = bad[0][1]
        out.write(f"last good offset: {first - 1} (truncate the partition to {first})\n")
    else:
        out.write(f"verify: all {len(report.batches)} batches decode\n")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="kafscale segments inspect",
        description="Print and validate a KAFS segment (exit 0 valid, 1 corrupt, 2 unreadable).",
    )
    parser.add_argument("target", metavar="PATH|URL", help="a .kfs file, file://PATH or s3://...")
    parser.add_argument("--verify", action="store_true", help="also decode every batch's records")
    args = parser.parse_args(argv)
    try:
        data, index = load(args.target)
    except (OSError, StoreError, ValueError) as exc:
        print(f"error: cannot read {args.target}: {exc!r}", file=sys.stderr)
        return 2
    report = validate_segment(data, index)
    print_report(args.target, len(data), report, sys.stdout)
    bad = verify_batches(data, report) if args.verify else []
    if args.verify:
        _print_verify(report, bad, sys.stdout)
    return 0 if report.ok and not bad else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
