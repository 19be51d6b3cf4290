"""A Fetch whose segment object cannot be read from S3 (SeaweedFS) fails that partition
alone, with KAFKA_STORAGE_ERROR (retriable): the other partitions of the same request
are served, the connection stays open, and once the object can be read again the same
fetch returns every record (broker/handlers/fetch.py, ``_partition_data``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.consumer import FetchResponse

from protocol.batch import iter_batches
from protocol.errors import ErrorCode
from protocol.records import decode_batch
from tests.fixtures.broker import start_broker
from tests.fixtures.s3 import S3Endpoint, create_bucket, s3_client
from tests.integration.kafka_raw import RawConn, fetch_request

pytestmark = pytest.mark.integration

TOPIC = "unreadable"
PER_PARTITION = 10


def _answers(conn: RawConn) -> dict[int, tuple[int, list[bytes | None]]]:
    """One Fetch of both partitions from offset 0: per partition, its error code and the
    values of the records returned."""
    req = fetch_request([(TOPIC, [(p, -1, 0, -1, 1 << 20) for p in (0, 1)])])
    resp: Any = conn.call(req, FetchResponse, 11)
    out = {}
    for part in resp.responses[0].partitions:
        values = [
            r.value
            for _h, view in iter_batches(memoryview(bytes(part.records or b"")))
            for r in decode_batch(view)[1]
        ]
        out[part.partition_index] = (part.error_code, values)
    return out


def test_an_unreadable_segment_fails_its_partition_alone(
    seaweedfs_s3: S3Endpoint, tmp_path: Path
) -> None:
    bucket = create_bucket(seaweedfs_s3)
    url = seaweedfs_s3.store_url(bucket, "ks")
    # no merges: the objects listed below stay the partition's only ones
    b = start_broker(tmp_path / "b", store_url=url, extra_args=("--merge-interval-ms", "0"))
    s3 = s3_client(seaweedfs_s3)
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic(TOPIC, 2)])[TOPIC].result(60)
        p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
        for i in range(2 * PER_PARTITION):
            p.produce(TOPIC, value=b"v%d" % i, partition=i % 2)
        assert p.flush(60) == 0
        del p  # no client but the fetches below after the restart
        sent = {q: [b"v%d" % i for i in range(q, 2 * PER_PARTITION, 2)] for q in (0, 1)}
        assert b.restart() is b  # an empty segment cache: the segments are in S3 only

        listed = s3.list_objects_v2(Bucket=bucket)["Contents"]
        moved = [o["Key"] for o in listed if f"/{TOPIC}/0/" in o["Key"]]
        assert moved and all(o["Key"].endswith(".kfs") for o in listed)
        bodies = {k: s3.get_object(Bucket=bucket, Key=k)["Body"].read() for k in moved}
        for k in moved:
            s3.delete_object(Bucket=bucket, Key=k)

        with RawConn(b.port) as conn:
            for _ in range(2):  # the failure poisons nothing: the same answer again
                answers = _answers(conn)
                assert answers[0] == (ErrorCode.KAFKA_STORAGE_ERROR, [])
                assert answers[1] == (ErrorCode.NONE, sent[1])
            for k, body in bodies.items():
                s3.put_object(Bucket=bucket, Key=k, Body=body)
            assert _answers(conn) == {0: (ErrorCode.NONE, sent[0]), 1: (ErrorCode.NONE, sent[1])}
    finally:
        s3.close()
        assert b.stop() == 0
    log = b.log_text()
    assert f"fetch of {TOPIC}-0 failed: ObjectNotFoundError" in log
    assert "Traceback" not in log
