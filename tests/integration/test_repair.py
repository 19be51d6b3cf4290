"""``kafscale partitions truncate`` and ``segments inspect --verify`` end to end, against
real etcd, a local-directory store and broker processes (issue 16).

A broker without full produce validation (``bench.noval_broker``: how brokers before
issue 16 behaved) accepts a batch whose header claims ~92 million records with a valid
CRC: the partition's high watermark jumps and librdkafka cannot read past it. The
operator finds the batch with ``segments inspect --verify``, truncation is refused while a
broker owns the partition, and after the broker stops, ``partitions truncate --execute``
cuts the log back; a restarted (validating) broker continues at the cut and a real client
reads everything back.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka.protocol.consumer import ListOffsetsRequest, ListOffsetsResponse

from protocol.batch import crc32c
from protocol.records import build_batch
from tests.fixtures.broker import start_broker
from tests.integration import kafka_raw as kr

pytestmark = pytest.mark.integration

TOPIC = "poisoned"


def _kafscale(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _log_end(port: int) -> int:
    """ListOffsets latest (the high watermark) without fetching: the records do not decode."""
    req = ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[(TOPIC, [(0, -1, -1)])])
    with kr.RawConn(port) as c:
        resp = c.call(req, ListOffsetsResponse, 5)
    (p,) = resp.topics[0].partitions
    assert p.error_code == 0
    return int(p.offset)


def _poison() -> bytes:
    batch = bytearray(build_batch([(b"k", b"poison", None)] * 3))
    struct.pack_into(">i", batch, 23, 92_341_796)
    struct.pack_into(">i", batch, 57, 92_341_797)
    struct.pack_into(">I", batch, 17, crc32c(memoryview(batch)[21:]))
    return bytes(batch)


def test_find_and_truncate_a_poisoned_partition(etcd_url: str, tmp_path: Path) -> None:
    prefix = f"/repair-{uuid.uuid4().hex[:8]}"
    store = f"file://{tmp_path}/store"
    common = ("--meta-prefix", prefix, "--store", store)
    meta = ("--meta", etcd_url, "--meta-prefix", prefix, "--store", store)
    b = start_broker(
        tmp_path / "b",
        meta_url=etcd_url,
        extra_args=(*common, "--merge-interval-ms", "0"),  # keep one object per flush
        module="bench.noval_broker",
    )
    try:
        for i in range(3):
            res = kr.produce_raw(b.port, TOPIC, 0, build_batch([(b"k", b"good-%d" % i, None)] * 2))
            assert res.error_code == 0 and res.base_offset == 2 * i
        bad = kr.produce_raw(b.port, TOPIC, 0, _poison())
        assert bad.error_code == 0 and bad.base_offset == 6  # the old behaviour
        assert _log_end(b.port) == 6 + 92_341_797
        # a running owner is never overridden
        refused = _kafscale("partitions", "truncate", TOPIC, "0", "--to", "6", "--execute", *meta)
        assert refused.returncode == 1 and "owned" in refused.stderr
    finally:
        b.stop()
    part = tmp_path / "store" / "default" / TOPIC / "0"
    verdicts = [
        _kafscale("segments", "inspect", "--verify", str(p)) for p in sorted(part.glob("*.kfs"))
    ]
    bad_runs = [v for v in verdicts if v.returncode != 0]
    assert len(bad_runs) == 1, [v.stdout for v in verdicts]
    assert "truncate the partition to 6" in bad_runs[0].stdout
    dry = _kafscale("partitions", "truncate", TOPIC, "0", "--to", "6", *meta)
    assert dry.returncode == 0 and "dry run" in dry.stdout, dry.stderr
    done = _kafscale("partitions", "truncate", TOPIC, "0", "--to", "6", "--execute", *meta)
    assert done.returncode == 0, done.stderr
    assert "now ends at 6" in done.stdout
    b2 = start_broker(tmp_path / "b2", meta_url=etcd_url, extra_args=common)
    try:
        assert kr.fetch_records(b2.port, TOPIC, 0).high_watermark == 6
        assert kr.produce_raw(b2.port, TOPIC, 0, _poison()).error_code == 87  # now refused
        p = Producer({"bootstrap.servers": b2.bootstrap, "acks": "all"})
        p.produce(TOPIC, value=b"after", partition=0)
        assert p.flush(15) == 0
        c = Consumer({"bootstrap.servers": b2.bootstrap, "group.id": "repair"})
        try:
            c.assign([TopicPartition(TOPIC, 0, 0)])
            got: list[tuple[int, bytes]] = []
            deadline = time.monotonic() + 20
            while len(got) < 7 and time.monotonic() < deadline:
                m = c.poll(0.5)
                if m is not None and m.error() is None:
                    got.append((int(m.offset() or 0), m.value() or b""))
            values = [b"good-%d" % (i // 2) for i in range(6)] + [b"after"]
            assert got == list(enumerate(values))
        finally:
            c.close()
    finally:
        b2.stop()
    assert "Traceback" not in b2.log_text()
