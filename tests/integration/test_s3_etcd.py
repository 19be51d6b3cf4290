"""The normal produce/consume path on a real S3 server (SeaweedFS) with a real etcd.

confluent-kafka produces to a multi-partition topic (keys, headers, null keys and values,
every compression codec) and a consumer reads everything back; the objects in the bucket
follow docs/format.md ("Object keys") and the keys in etcd (read with ``etcdctl``) follow
docs/format.md ("Metadata keys"), with
manifest entries that name the objects' real ETags.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from protocol.records import build_batch
from tests.fixtures.broker import BrokerProcess, start_broker
from tests.fixtures.etcd import start_etcd
from tests.fixtures.s3 import S3Endpoint, create_bucket
from tests.integration import kafka_raw as kr
from tests.integration.backends import consume_all
from tests.integration.logcheck import Backend, check_partition, object_key

pytestmark = pytest.mark.integration

PARTITIONS = 4
PER_CODEC = 150
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
# plain segments, and merged ones (segment-{base}-{last}, docs/format.md)
SEGMENT_KEY = re.compile(
    r"^kafscale/default/([^/]+)/(\d+)/"
    r"segment-(\d{20})-(\d{20})-e(\d{10})-([0-9a-f]{8})-(\d{12})\.(kfs|index)$"
)


@pytest.fixture
def s3_env(
    seaweedfs_s3: S3Endpoint, etcd_url: str, tmp_path: Path
) -> Iterator[tuple[Backend, BrokerProcess, str]]:
    bucket = create_bucket(seaweedfs_s3)
    prefix = f"/kafscale-{uuid.uuid4().hex[:8]}"
    backend = Backend(
        "s3-etcd", seaweedfs_s3.store_url(bucket, "kafscale"), etcd_url, meta_prefix=prefix
    )
    b = start_broker(
        tmp_path / "broker",
        store_url=backend.store_url,
        meta_url=etcd_url,
        node_id=3,
        extra_args=backend.broker_args(),
    )
    try:
        yield backend, b, bucket
    finally:
        b.stop()
        print(b.log_text()[-5000:])
    assert "Traceback" not in b.log_text()


def _etcdctl(etcd_url: str, *args: str) -> str:
    endpoint = "http://" + etcd_url[len("etcd://") :]
    env = {**os.environ, "ETCDCTL_API": "3"}
    out = subprocess.run(
        ["etcdctl", f"--endpoints={endpoint}", *args],
        capture_output=True,
        text=True,
        timeout=20,
        env=env,
        check=True,
    )
    return out.stdout


def _etcd_kv(etcd_url: str, prefix: str) -> dict[str, bytes]:
    lines = _etcdctl(etcd_url, "get", "--prefix", prefix + "/").splitlines()
    return {lines[i][len(prefix) :]: lines[i + 1].encode() for i in range(0, len(lines), 2)}


def _produce(bootstrap: str, topic: str) -> dict[tuple[bytes | None, bytes | None], int]:
    sent: dict[tuple[bytes | None, bytes | None], int] = {}
    for codec in CODECS:
        p = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "compression.type": codec,
                "linger.ms": 5,
            }
        )
        for i in range(PER_CODEC):
            key = None if i % 10 == 0 else f"{codec}-key-{i}".encode()
            value = None if i % 17 == 0 else f"{codec}-value-{i}-".encode() * (i % 5 + 1)
            part = i % PARTITIONS
            p.produce(topic, key=key, value=value, partition=part, headers=[("codec", codec)])
            sent[(key, value)] = part
        assert p.flush(30) == 0
    return sent


def test_produce_consume_on_s3_and_etcd(s3_env: tuple[Backend, BrokerProcess, str]) -> None:
    backend, b, bucket = s3_env
    topic = "s3-orders"
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS)])
    futures[topic].result(15)
    sent = _produce(b.bootstrap, topic)
    total = len(CODECS) * PER_CODEC
    got = consume_all(b.bootstrap, topic, PARTITIONS, total)
    assert sum(len(v) for v in got.values()) == total
    seen: dict[tuple[bytes | None, bytes | None], int] = {}
    for part, recs in got.items():
        assert [o for o, _, _ in recs] == list(range(len(recs)))  # contiguous per partition
        for _o, k, v in recs:
            seen[(k, v)] = part
    # every (key, value) came back, in the partition it was sent to (null-key rows repeat
    # across codecs only through distinct values, so the mapping is exact)
    assert seen == sent

    # docs/format.md, "Object keys": writer-unique names in the bucket
    objects = _list_bucket(backend, bucket)
    assert objects, "no objects written"
    for key in objects:
        m = SEGMENT_KEY.match(key)
        assert m, f"object key {key!r} does not follow docs/format.md"
        assert m.group(1) == topic and int(m.group(2)) < PARTITIONS
    # docs/format.md, "Metadata keys": keys in etcd
    kv = _etcd_kv(backend.meta_url, backend.meta_prefix)
    broker = json.loads(kv["/brokers/3"])
    assert broker["host"] == "127.0.0.1" and int(broker["port"]) == b.port and "rack" in broker
    tinfo = json.loads(kv[f"/topics/{topic}"])
    assert tinfo["partitions"] == PARTITIONS and "configs" in tinfo
    uuid.UUID(str(tinfo["id"]))
    etags = {k: v for k, v in objects.items() if k.endswith(".kfs")}
    for p in range(PARTITIONS):
        owner = json.loads(kv[f"/owners/{topic}/{p}"])
        assert owner["broker"] == 3 and owner["epoch"] >= 1
        end = json.loads(kv[f"/logs/{topic}/{p}/end"])
        assert end["next_offset"] == len(got[p]) and end["epoch"] == owner["epoch"]
        entries = [k for k in kv if k.startswith(f"/logs/{topic}/{p}/segments/")]
        assert entries
        for ekey in entries:
            base = ekey.rsplit("/", 1)[1]
            assert re.fullmatch(r"\d{20}", base), ekey
            e = json.loads(kv[ekey])
            assert {"last", "bytes", "records", "max_ts", "etag"} <= set(e)
            okey = "kafscale/" + object_key("default", topic, p, {**e, "base": int(base)})
            assert e["etag"].strip('"') == etags[okey].strip('"')
        state = check_partition(backend, topic, p)
        assert state.next_offset == len(got[p])
    # the owner keys are leased: etcd shows a lease on them
    lease_out = _etcdctl(
        backend.meta_url, "get", f"{backend.meta_prefix}/owners/{topic}/0", "-w", "json"
    )
    assert json.loads(lease_out)["kvs"][0].get("lease", 0) != 0


def _list_bucket(backend: Backend, bucket: str) -> dict[str, str]:
    """Every object key in ``bucket`` with its ETag."""
    import boto3
    from botocore.config import Config

    query = dict(kv.split("=", 1) for kv in backend.store_url.split("?", 1)[1].split("&"))
    client = boto3.client(
        "s3",
        endpoint_url=query["endpoint"],
        region_name=query["region"],
        aws_access_key_id=query["access_key"],
        aws_secret_access_key=query["secret_key"],
        config=Config(s3={"addressing_style": "path"}),
    )
    out: dict[str, str] = {}
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                out[obj["Key"]] = obj["ETag"]
    finally:
        client.close()
    return out


def test_kcat_round_trip_on_s3(s3_env: tuple[Backend, BrokerProcess, str]) -> None:
    backend, b, _bucket = s3_env
    lines = [f"kcat-line-{i}" for i in range(50)]
    subprocess.run(
        ["kcat", "-P", "-b", b.bootstrap, "-t", "kcat-s3", "-p", "0"],
        input="\n".join(lines) + "\n",
        text=True,
        check=True,
        timeout=30,
    )
    out = subprocess.run(
        ["kcat", "-C", "-b", b.bootstrap, "-t", "kcat-s3", "-p", "0", "-o", "beginning",
         "-c", "50", "-e", "-f", "%o %s\n"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )  # fmt: skip
    assert out.stdout.splitlines() == [f"{i} {line}" for i, line in enumerate(lines)]
    assert check_partition(backend, "kcat-s3", 0).next_offset == 50


def test_etcd_restart_under_load(seaweedfs_s3: S3Endpoint, tmp_path: Path) -> None:
    """etcd goes away for a few seconds while a producer writes: nothing acknowledged is
    lost, the broker reconnects, and the log stays contiguous and valid."""
    (tmp_path / "etcd").mkdir()
    etcd = start_etcd(tmp_path / "etcd")
    backend = Backend(
        "s3-etcd", seaweedfs_s3.store_url(create_bucket(seaweedfs_s3), "kafscale"), etcd.url
    )
    b = start_broker(
        tmp_path / "broker",
        store_url=backend.store_url,
        meta_url=etcd.url,
        extra_args=(*backend.broker_args(), "--lease-ttl", "10"),
    )
    acked: dict[bytes, int] = {}
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is None:
            acked[msg.value()] = msg.offset()
        else:
            errors.append(str(err))

    p = Producer(
        {
            "bootstrap.servers": b.bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": 60000,
            "log_level": 0,
        }
    )
    try:

        def outage() -> None:
            time.sleep(0.5)  # let the load run first
            etcd.stop()
            time.sleep(2.0)  # etcd stays away this long

        bounce = threading.Thread(target=outage)
        bounce.start()
        i = 0
        while bounce.is_alive() or i < 3000:
            for _ in range(50):
                p.produce("etcd-bounce", value=b"e-%d" % i, on_delivery=on_delivery)
                i += 1
            p.poll(0.01)
        bounce.join()
        etcd = start_etcd(tmp_path / "etcd", etcd.client_port, etcd.peer_port)
        backend = Backend(backend.name, backend.store_url, etcd.url)
        assert p.flush(60) == 0
        assert not errors, errors[:3]
        assert len(acked) == i
        got = kr.fetch_all(b.port, "etcd-bounce", 0)
        by_offset = {o: v for o, _, v in got.records}
        assert [o for o, _, _ in got.records] == list(range(got.high_watermark))
        assert all(by_offset.get(o) == v for v, o in acked.items())
        res = kr.produce_raw(b.port, "etcd-bounce", 0, build_batch([(None, b"end", None)]))
        assert res.error_code == 0 and res.base_offset == got.high_watermark
        b.stop()
        check_partition(backend, "etcd-bounce", 0)
        assert "Traceback" not in b.log_text()
        # the outage is logged, not spun on: watches back off while etcd is away
        assert len(b.log_text().splitlines()) < 200, "log flooded during the etcd outage"
    finally:
        b.kill9()
        print(b.log_text()[-5000:])
        etcd.stop()
