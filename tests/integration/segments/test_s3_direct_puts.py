"""``S3Store.put_if_absent``: the direct conditional PUTs (segments/s3_direct_put.py)
against real S3 servers (moto's server and SeaweedFS): the same objects, ETags and
refusals as the SDK's PUT, without falling back to it; the condition and the body's
checksum are part of the signature, so neither can be dropped on the way."""

from __future__ import annotations

import asyncio
import hashlib
import http.client
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from crc32c import crc32c as crc32c_of

from segments.s3_direct_put import EXPIRES_S, DirectPutter, checksum_header
from segments.s3_store import S3Store
from segments.store import Buffer, ObjectExistsError, StoreError, open_store
from tests.fixtures.broker import start_broker
from tests.fixtures.s3 import S3Endpoint, create_bucket, s3_client
from tests.integration.backends import consume_all

pytestmark = pytest.mark.integration


@pytest.fixture(params=["moto", "seaweedfs"], ids=["s3-moto", "s3-seaweedfs"])
async def direct(request: pytest.FixtureRequest) -> AsyncIterator[S3Store]:
    """A store whose SDK PUT fails the test: every answer must come from the direct path."""
    endpoint: S3Endpoint = request.getfixturevalue(f"{request.param}_s3")
    bucket = await asyncio.to_thread(create_bucket, endpoint)
    s = open_store(endpoint.store_url(bucket, "pfx"))
    assert isinstance(s, S3Store)

    async def no_sdk_put(*args: Any, **kwargs: Any) -> str:
        raise AssertionError(f"fell back to the SDK PUT: {args[0]}")

    s._sdk_put = no_sdk_put  # type: ignore[method-assign]  # noqa: SLF001
    s.server = endpoint.name  # type: ignore[attr-defined]
    yield s
    await s.close()


async def test_put_writes_the_bytes_and_refuses_an_existing_key(direct: S3Store) -> None:
    parts: list[Buffer] = [bytes(range(256)) * 4096, memoryview(b"mid"), bytearray(b"tail")]
    payload = b"".join(parts)
    etag = await direct.put_if_absent("seg/a b+c.kfs", parts)  # a key that needs quoting
    assert etag == hashlib.md5(payload).hexdigest()  # S3's ETag of a single-part PUT
    info = await direct.head("seg/a b+c.kfs")
    assert info is not None and info.etag == etag and info.size == len(payload)
    assert await direct.get("seg/a b+c.kfs") == payload
    with pytest.raises(ObjectExistsError):
        await direct.put_if_absent("seg/a b+c.kfs", [b"overwrite"])
    assert await direct.get("seg/a b+c.kfs") == payload  # untouched
    for i in range(3):  # kept-alive connections are reused
        small = b"x" * i
        assert await direct.put_if_absent(f"seg/n{i}", [small]) == hashlib.md5(small).hexdigest()


async def test_concurrent_direct_puts_one_winner(direct: S3Store) -> None:
    results = await asyncio.gather(
        *(direct.put_if_absent("race/k", [f"writer-{i}".encode() * 1000]) for i in range(6)),
        return_exceptions=True,
    )
    wins = [r for r in results if isinstance(r, str)]
    assert len(wins) == 1, results
    assert all(isinstance(r, ObjectExistsError) for r in results if not isinstance(r, str))
    assert (await direct.head("race/k")).etag == wins[0]  # type: ignore[union-attr]


async def test_a_wrong_crc32c_is_refused_not_stored(direct: S3Store) -> None:
    """The CRC-32C a caller gives (``put_if_absent``'s ``crc32c``, the broker's segments)
    travels as the signed checksum: a wrong one is refused by the server and the PUT
    fails, with no fallback to the SDK (the fixture fails the test on one); the right one
    is taken. The net under CRCs derived without reading the bytes."""
    if direct.server != "seaweedfs":  # type: ignore[attr-defined]
        pytest.skip("moto's server does not verify x-amz-checksum-crc32c")
    body = bytes(range(256)) * 4096
    crc = crc32c_of(body)
    with pytest.raises(StoreError, match="CRC-32C"):
        await direct.put_if_absent("crc/obj", [body], crc32c=crc ^ 0x10)
    assert await direct.head("crc/obj") is None  # nothing stored
    assert direct._puts is not None  # noqa: SLF001  # direct PUTs stay on
    etag = await direct.put_if_absent("crc/obj", [body[:1000], body[1000:]], crc32c=crc)
    assert etag == hashlib.md5(body).hexdigest()
    assert await direct.get("crc/obj") == body


def _send(url: str, target: str, headers: dict[str, str], body: bytes) -> int:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    try:
        conn.request("PUT", target, body=body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


async def test_the_condition_and_the_checksum_are_signed(direct: S3Store) -> None:
    """The presigned request cannot lose its If-None-Match (an overwrite) or carry another
    body than the one whose CRC-32C it signed."""
    if direct.server != "seaweedfs":  # type: ignore[attr-defined]
        pytest.skip("moto's server verifies neither the signed headers nor the checksum")
    client = await direct._get_client()  # noqa: SLF001
    auth = await client._request_signer.get_auth_instance(  # noqa: SLF001
        "s3", client.meta.region_name, "s3v4-query", expires=EXPIRES_S
    )
    url = f"{client.meta.endpoint_url}/{direct.bucket}/{direct.prefix}sig/obj"
    body = b"the body" * 1000
    target, headers = DirectPutter.sign(url, auth, [body])
    assert "if-none-match" in target and "x-amz-checksum-crc32c" in target  # SignedHeaders
    no_condition = {k: v for k, v in headers.items() if k != "If-None-Match"}
    assert await asyncio.to_thread(_send, url, target, no_condition, body) == 403
    assert await asyncio.to_thread(_send, url, target, headers, body[:-1] + b"!") == 400
    assert await direct.head("sig/obj") is None  # neither was written
    assert await asyncio.to_thread(_send, url, target, headers, body) == 200
    assert await direct.get("sig/obj") == body
    assert await asyncio.to_thread(_send, url, target, headers, body) == 412  # exists now


def test_a_broker_writes_its_segments_by_direct_puts(
    seaweedfs_s3: S3Endpoint, tmp_path: Path
) -> None:
    """Produce (acks=all) to a broker on SeaweedFS: every acknowledged record reads back,
    every segment object in the bucket carries the CRC-32C of its bytes as SeaweedFS
    stored it (each PUT carried the checksum, direct or through the SDK), and the broker
    never fell back from direct PUTs to the SDK's (it logs one warning when it does)."""
    bucket = create_bucket(seaweedfs_s3)
    b = start_broker(tmp_path / "broker", store_url=seaweedfs_s3.store_url(bucket, "ks"))
    try:
        topic, n = "direct-puts", 3000
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic(topic, num_partitions=2)])[topic].result(30)
        p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5})
        for i in range(n):
            p.produce(topic, value=f"v{i}-".encode() * 40, partition=i % 2)
        assert p.flush(60) == 0
        got = consume_all(b.bootstrap, topic, 2, n)
        values = sorted(v for recs in got.values() for _o, _k, v in recs if v is not None)
        assert values == sorted(f"v{i}-".encode() * 40 for i in range(n))
        client = s3_client(seaweedfs_s3)
        try:
            keys = [
                o["Key"]
                for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
                for o in page.get("Contents", [])
                if o["Key"].endswith(".kfs")
            ]
            assert keys
            for key in keys:
                head = client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
                body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
                assert head.get("ChecksumCRC32C") == checksum_header([body]), key
        finally:
            client.close()
    finally:
        b.stop()
    assert "Traceback" not in b.log_text()
    assert "direct S3 PUTs refused" not in b.log_text()


async def test_a_refused_direct_put_falls_back_to_the_sdk_and_turns_off(
    seaweedfs_s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that refuses the direct form (here: a signature it cannot verify, 403) but
    takes the SDK's PUT: the object is written once, by the SDK, and later PUTs skip the
    direct path; a conditional PUT over it is still refused."""
    bucket = await asyncio.to_thread(create_bucket, seaweedfs_s3)
    s = open_store(seaweedfs_s3.store_url(bucket, "fb"))
    assert isinstance(s, S3Store) and s._puts is not None  # noqa: SLF001
    sign = DirectPutter.sign

    def bad_signature(url: str, auth: Any, data: Any, *crc: Any) -> tuple[str, dict[str, str]]:
        target, headers = sign(url, auth, data, *crc)
        return target[:-1] + ("1" if target.endswith("0") else "0"), headers  # X-Amz-Signature

    monkeypatch.setattr(DirectPutter, "sign", staticmethod(bad_signature))
    try:
        etag = await s.put_if_absent("fb/obj", [b"payload"])
        assert etag == hashlib.md5(b"payload").hexdigest()
        assert s._puts is None  # noqa: SLF001
        assert await s.get("fb/obj") == b"payload"
        with pytest.raises(ObjectExistsError):
            await s.put_if_absent("fb/obj", [b"other"])
    finally:
        await s.close()
