"""The two store + metadata pairs the integration tests run brokers on, and client helpers.

- ``local``: a local directory store with the embedded metadata store (the defaults).
- ``s3-etcd``: SeaweedFS (real S3 server) with a real etcd, a fresh bucket and key prefix
  per test.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.fixtures.s3 import create_bucket
from tests.integration.logcheck import Backend


def make_backend(request: pytest.FixtureRequest, kind: str, workdir: Path) -> Backend:
    workdir.mkdir(parents=True, exist_ok=True)
    if kind == "local":
        data = workdir / "data"
        return Backend("local", f"file://{data}", "embedded", data_dir=str(data))
    endpoint = request.getfixturevalue("seaweedfs_s3")
    etcd = request.getfixturevalue("etcd_url")
    bucket = create_bucket(endpoint)
    prefix = f"/kafscale-{uuid.uuid4().hex[:8]}"
    return Backend(
        "s3-etcd",
        endpoint.store_url(bucket, "kafscale"),
        etcd,
        meta_prefix=prefix,
        extra_args=("--lease-ttl", "3"),  # a restart after kill -9 waits out the old lease
    )


def consume_all(
    bootstrap: str, topic: str, partitions: int, expected: int, timeout: float = 30.0
) -> dict[int, list[tuple[int, bytes | None, bytes | None]]]:
    """Read ``expected`` records from offset 0 of every partition with librdkafka."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )
    out: dict[int, list[tuple[int, bytes | None, bytes | None]]] = {
        p: [] for p in range(partitions)
    }
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        n = 0
        deadline = time.monotonic() + timeout
        while n < expected and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                if m.error() is None:
                    out[m.partition() or 0].append((m.offset() or 0, m.key(), m.value()))
                    n += 1
    finally:
        c.close()
    return out
