"""``S3Store.put_if_absent`` through the SDK's PUT (``direct_puts=false``: what runs on
virtual-hosted-style URLs and behind proxies) with the caller's CRC-32C: it travels as
``x-amz-checksum-crc32c``, a server that finds other bytes refuses the PUT and nothing is
stored; a store that refuses the header itself gets the PUT without it, only after the
bytes were hashed here (docs/operations.md, "Direct PUTs"). Real servers: moto's and
SeaweedFS, and SeaweedFS behind a small proxy that answers a checksum header as Backblaze
B2 does (400 ``InvalidArgument``, "Unsupported header")."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import http.client
import http.server
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from importlib.metadata import version

import pytest
from crc32c import crc32c as crc32c_of

from segments.s3_direct_put import checksum_header
from segments.s3_store import S3Store
from segments.store import Buffer, StoreError, open_store
from tests.fixtures.s3 import S3Endpoint, create_bucket, s3_client

pytestmark = pytest.mark.integration

BODY = bytes(range(256)) * 2048  # 512 KiB: below the SDK's Expect: 100-continue size
CRC = crc32c_of(BODY)


async def _sdk_store(endpoint: S3Endpoint) -> S3Store:
    bucket = await asyncio.to_thread(create_bucket, endpoint)
    s = open_store(endpoint.store_url(bucket, "pfx") + "&direct_puts=false")
    assert isinstance(s, S3Store) and s._puts is None  # noqa: SLF001
    return s


@pytest.fixture(params=["moto", "seaweedfs"], ids=["s3-moto", "s3-seaweedfs"])
async def sdk(request: pytest.FixtureRequest) -> AsyncIterator[S3Store]:
    """A store whose PUTs go through the SDK (no direct PUTs)."""
    endpoint: S3Endpoint = request.getfixturevalue(f"{request.param}_s3")
    s = await _sdk_store(endpoint)
    s.server = endpoint  # type: ignore[attr-defined]
    yield s
    await s.close()


def _stored_checksum(endpoint: S3Endpoint, bucket: str, key: str) -> str | None:
    client = s3_client(endpoint)
    try:
        head = client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        return head.get("ChecksumCRC32C")
    finally:
        client.close()


async def test_sdk_put_refuses_a_wrong_crc32c(sdk: S3Store) -> None:
    parts: list[Buffer] = [BODY[:1000], memoryview(BODY[1000:])]
    try:
        await sdk.put_if_absent("crc/obj", parts, crc32c=CRC ^ 0x10)
    except StoreError as exc:
        assert "CRC-32C" in str(exc)
    else:  # checked, not assumed: the server took a body that differs from its checksum
        assert sdk.server.name == "moto", "the SDK's PUT stored a wrong CRC-32C"  # type: ignore[attr-defined]
        pytest.skip(f"moto {version('moto')} does not check x-amz-checksum-crc32c")
    assert await sdk.head("crc/obj") is None  # nothing stored
    assert await sdk.put_if_absent("crc/obj", parts, crc32c=CRC)  # the key is free


async def test_sdk_put_with_its_crc32c_or_none(sdk: S3Store) -> None:
    etag = await sdk.put_if_absent("crc/given", [BODY[:7], BODY[7:]], crc32c=CRC)
    assert etag == hashlib.md5(BODY).hexdigest()
    info = await sdk.head("crc/given")
    assert info is not None and info.etag == etag and info.size == len(BODY)
    assert await sdk.get("crc/given") == BODY
    endpoint: S3Endpoint = sdk.server  # type: ignore[attr-defined]
    if endpoint.name == "seaweedfs":  # the checksum was sent (and kept) with the object
        stored = await asyncio.to_thread(_stored_checksum, endpoint, sdk.bucket, "pfx/crc/given")
        assert stored == checksum_header([BODY])
    plain = await sdk.put_if_absent("crc/plain", [BODY])
    info = await sdk.head("crc/plain")
    assert plain == etag and info is not None and info.etag == plain


class _NoChecksums(http.server.BaseHTTPRequestHandler):
    """Forwards requests to ``server.upstream`` as they came (the signature covers the
    Host header), but answers one carrying ``x-amz-checksum-*`` as Backblaze B2 does."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers:
            if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if any(h.lower().startswith("x-amz-checksum-") for h in self.headers):
            self.server.refusals += 1  # type: ignore[attr-defined]
            error = (
                "<Error><Code>InvalidArgument</Code><Message>Unsupported header "
                "'x-amz-checksum-crc32c' received for this API call.</Message></Error>"
            )
            self._answer(400, [("Content-Type", "application/xml")], error.encode())
            return
        host, port = self.server.upstream  # type: ignore[attr-defined]
        conn = http.client.HTTPConnection(host, port, timeout=30)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() != "expect"}
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            self._answer(resp.status, resp.getheaders(), resp.read())
        finally:
            conn.close()

    do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _forward  # noqa: N815


@pytest.fixture
def no_checksums(seaweedfs_s3: S3Endpoint) -> Iterator[tuple[str, http.server.HTTPServer]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NoChecksums)
    host, port = seaweedfs_s3.url.removeprefix("http://").split(":")
    server.upstream = (host, int(port))  # type: ignore[attr-defined]
    server.refusals = 0  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def test_a_store_without_the_checksum_header_gets_verified_bytes(
    seaweedfs_s3: S3Endpoint,
    no_checksums: tuple[str, http.server.HTTPServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The header refused (not a mismatch): a wrong CRC-32C still fails, by the hash
    here, and nothing is stored; the right one is put without the header, with one
    warning, and later PUTs skip the header (each hashed here first)."""
    url, proxy = no_checksums
    s = await _sdk_store(dataclasses.replace(seaweedfs_s3, url=url))
    caplog.set_level(logging.WARNING, "segments.s3_store")
    try:
        with pytest.raises(StoreError, match="CRC-32C"):
            await s.put_if_absent("nc/a", [BODY], crc32c=CRC ^ 1)
        assert await s.head("nc/a") is None
        assert proxy.refusals == 1 and not caplog.records  # type: ignore[attr-defined]
        assert await s.put_if_absent("nc/a", [BODY], crc32c=CRC) == hashlib.md5(BODY).hexdigest()
        assert await s.put_if_absent("nc/b", [BODY[:9], BODY[9:]], crc32c=CRC)
        with pytest.raises(StoreError, match="CRC-32C"):
            await s.put_if_absent("nc/c", [BODY], crc32c=CRC ^ 1)
        assert await s.head("nc/c") is None
        assert await s.get("nc/b") == BODY
        assert proxy.refusals == 2  # type: ignore[attr-defined]
        assert [r.getMessage() for r in caplog.records] == [
            "S3 PUTs with a checksum refused (InvalidArgument): sent without one"
        ]
    finally:
        await s.close()
