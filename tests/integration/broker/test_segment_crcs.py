"""Segments written by a broker whose CRCs were derived, not hashed (docs/benchmarks.md,
"Round 4: CRC passes"): librdkafka produces large batches (past ``COMBINE_MIN``) to a
broker on the local store, to a CreateTime topic (the batches' CRCs as verified on
produce) and a LogAppendTime one (CRCs the broker recomputed after stamping); every
record reads back, every segment object's footer CRC is its body's CRC, and its ETag is
the CRC-32C of its bytes, hashed here from the files. The store URL carries
``keep_page_cache=true`` (segments/local_store.py), which the broker takes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import crc32c as crc_pkg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from segments.format import COMBINE_MIN, SEGMENT_SUFFIX, iter_segment_batches
from segments.local_store import LocalStore, crc_etag
from segments.validate import validate_segment
from tests.fixtures.broker import start_broker
from tests.integration.backends import consume_all

pytestmark = pytest.mark.integration

N = 4000
SIZE = 1024


def test_derived_crcs_match_the_bytes(tmp_path: Path) -> None:
    root = tmp_path / "store"
    b = start_broker(tmp_path / "broker", store_url=f"file://{root}?keep_page_cache=true")
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        topics = {
            "crc-create": NewTopic("crc-create", num_partitions=1),
            "crc-append": NewTopic(
                "crc-append", num_partitions=1, config={"message.timestamp.type": "LogAppendTime"}
            ),
        }
        for fut in admin.create_topics(list(topics.values())).values():
            fut.result(30)
        p = Producer(
            {
                "bootstrap.servers": b.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 50,
            }
        )
        for i in range(N):
            for topic in topics:
                p.produce(topic, value=f"{i:08d}".encode() * (SIZE // 8))
        assert p.flush(60) == 0
        for topic in topics:
            got = consume_all(b.bootstrap, topic, 1, N, timeout=60)
            values = [v for _o, _k, v in got[0]]
            assert values == [f"{i:08d}".encode() * (SIZE // 8) for i in range(N)], topic
    finally:
        b.stop()
    assert "Traceback" not in b.log_text()

    store = LocalStore(str(root))
    objects = asyncio.run(store.list(""))
    segments = [o for o in objects if o.key.endswith(SEGMENT_SUFFIX)]
    assert {o.key.split("/")[1] for o in segments} == set(topics)
    largest = 0
    for info in segments:
        data = (root / info.key).read_bytes()
        report = validate_segment(data)
        assert report.ok, (info.key, report.problems)
        assert info.etag == crc_etag(crc_pkg.crc32c(data), len(data)), info.key
        largest = max([largest, *(hdr.size for _p, hdr, _v in iter_segment_batches(data))])
    assert largest >= COMBINE_MIN  # the combined path was taken
