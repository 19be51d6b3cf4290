"""Cost of produce validation (issue 16): the produce handler's batch checks, in process.

For each codec, builds Produce request bodies the way librdkafka sends them under load
(1 KiB values, half random and half repeated so compression has something to do,
``--batch-records`` records per batch, one batch per partition record set), then runs the
broker's own produce path up to the append (``decode_produce`` + ``broker.handlers.
produce.validate_records``) with full validation (``BrokerConfig.validate_records``, the default)
and without it (the pre-issue-16 checks: framing, CRC, header fields). Prints CPU ms per
MB of record-set bytes as sent (``time.process_time``) and MB/s of one core, median of
``--rounds``. Not a test: it asserts nothing.

    python -m bench.validation [--rounds 5] [--mb 64] [--batch-records 1000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from broker.handlers.produce import validate_records
from protocol.compression import Compression
from protocol.produce_fast import decode_produce
from protocol.records import build_batch
from protocol.validate import TimestampPolicy

MB = 1_000_000


def _request(codec: Compression, records: int) -> tuple[bytes, int]:
    """One Produce v9 body of ~``records`` KiB and its record-set bytes."""
    from kafka.protocol.producer import ProduceRequest

    half = 512
    recs = [
        (b"key-%d" % i, os.urandom(half) + bytes([i & 0xFF]) * half, [("h", b"1")])
        for i in range(records)
    ]
    batch = build_batch(recs, compression=codec)
    req = ProduceRequest(
        transactional_id=None, acks=-1, timeout_ms=1000, topic_data=[("t", [(0, batch)])]
    )
    return bytes(req.encode(version=9)), len(batch)


def _run(body: bytes, count: int, full: bool) -> float:
    policy = TimestampPolicy()
    bufs = [bytearray(body) for _ in range(count)]  # fresh writable frames, as received
    start = time.process_time()
    for buf in bufs:
        req = decode_produce(memoryview(buf), 9)
        for t in req.topics:
            for p in t.partitions:
                assert p.records is not None
                validate_records(p.records, policy, 64 << 20, full)
    return time.process_time() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.validation")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mb", type=int, default=64, help="record-set MB per measurement")
    ap.add_argument("--batch-records", type=int, default=1000)
    args = ap.parse_args(argv)
    print(f"{'codec':8} {'batch KB':>9} {'full ms/MB':>11} {'full MB/s':>10} "
          f"{'off ms/MB':>10} {'off MB/s':>9} {'cost ms/MB':>11}")  # fmt: skip
    for codec in Compression:
        body, nbytes = _request(codec, args.batch_records)
        count = max(1, args.mb * MB // nbytes)
        mbytes = count * nbytes / MB
        res: dict[bool, float] = {}
        for full in (True, False):
            secs = statistics.median(_run(body, count, full) for _ in range(args.rounds))
            res[full] = secs * 1000 / mbytes
        print(
            f"{codec.name:8} {nbytes / 1000:9.1f} {res[True]:11.3f} {1000 / res[True]:10.0f} "
            f"{res[False]:10.3f} {1000 / res[False]:9.0f} {res[True] - res[False]:11.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
