"""Direct conditional PUTs of segment objects for ``S3Store.put_if_absent``
(docs/benchmarks.md, "Round 3: S3 produce"; docs/operations.md, ``direct_puts``).

The SDK path (aiobotocore over aiohttp) spends CPU per MB of every segment on the event
loop: the SHA-256 of the body for the payload signature (plain http), a copy of the body
into aiohttp's ``BytesIOPayload``, and the socket writes of the body in chunks. Here:

- the request is signed by the SDK's own SigV4 signer as a presigned URL (query
  authentication, ``UNSIGNED-PAYLOAD``, valid 15 minutes) with two **signed** headers:
  ``If-None-Match: *`` (the conditional create: the server refuses an existing key with
  412, as for the SDK's ``IfNoneMatch="*"``) and ``x-amz-checksum-crc32c``, the CRC-32C of
  the body computed here (~0.05 ms per MB), or the one the caller derived
  (``put_if_absent``'s ``crc32c``: the broker's segments, whose CRC comes from the
  batches' verified CRCs without another pass; docs/benchmarks.md, "Round 4: CRC
  passes"): the server recomputes it and refuses a body that differs (400
  ``BadDigest``). That is the integrity check the payload signature gave over plain
  http, at a tenth of its cost, and end to end on https too; with a derived CRC it also
  catches bytes that changed in memory after they were verified;
- ``http.client`` sends it from a small thread pool: the headers, then each buffer by
  ``sendall`` (no join, no copy, the GIL released while the socket takes it).

Outcomes decided here: 200 with an ETag (the object is written: acknowledged only then),
412 or 409 (the key exists). Anything else (a connection failure, a 4xx such as a store
that does not know the checksum header, a 5xx) returns ``None``: the caller puts through
the SDK path, with its retries and its error mapping.
"""

from __future__ import annotations

import base64
import http.client
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from botocore.awsrequest import AWSRequest

from protocol.batch import crc32c
from segments.s3_direct import DirectHTTP
from segments.store import Buffer

log = logging.getLogger(__name__)

THREADS = 16  # concurrent direct PUTs per store (the flusher's default concurrency)
EXPIRES_S = 900


@dataclass(frozen=True, slots=True)
class PutReply:
    status: int
    etag: str | None = None  # without quotes (200 only; None if the server sent none)


def data_crc(data: Sequence[Buffer]) -> int:
    """The CRC-32C of the concatenation of ``data``."""
    value = 0
    for buf in data:
        value = crc32c(buf, value)
    return value


def checksum_header(data: Sequence[Buffer], crc: int | None = None) -> str:
    """The ``x-amz-checksum-crc32c`` value of the concatenation of ``data`` (``crc``: its
    CRC-32C, already known)."""
    value = data_crc(data) if crc is None else crc
    return base64.b64encode(value.to_bytes(4, "big")).decode()


class DirectPutter(DirectHTTP):
    def __init__(self, ca_bundle: str | None = None, threads: int = THREADS) -> None:
        super().__init__(ca_bundle, threads, "s3-put")

    async def put(
        self, url: str, auth: Any, data: Sequence[Buffer], crc: int | None = None
    ) -> PutReply | None:
        """PUT the concatenation of ``data`` at ``url`` (the object's URL, no query) if
        absent, signed by ``auth`` (botocore's ``S3SigV4QueryAuth``), with ``crc`` (its
        CRC-32C; None: computed here) as its checksum. None: use the SDK."""
        try:
            return await self._pool.run(self._put, url, auth, data, crc)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            log.debug("direct PUT failed, falling back to the SDK: %s", exc)
            return None

    @staticmethod
    def sign(
        url: str, auth: Any, data: Sequence[Buffer], crc: int | None = None
    ) -> tuple[str, dict[str, str]]:
        """The presigned target (path and query) and the headers it was signed with."""
        headers = {"If-None-Match": "*", "x-amz-checksum-crc32c": checksum_header(data, crc)}
        request = AWSRequest(method="PUT", url=url, headers=headers)
        auth.add_auth(request)
        signed = urlsplit(request.prepare().url)
        return signed.path + "?" + signed.query, headers

    def _put(self, url: str, auth: Any, data: Sequence[Buffer], crc: int | None) -> PutReply | None:
        parts = urlsplit(url)
        target, headers = self.sign(url, auth, data, crc)
        length = sum(memoryview(b).nbytes for b in data)
        host = parts.hostname or ""
        for attempt in (0, 1):  # a kept-alive connection the server had closed: once more
            conn = self._conn(parts.scheme, host, parts.port)
            fresh = conn.sock is None
            try:
                conn.putrequest("PUT", target, skip_accept_encoding=True)
                conn.putheader("Content-Length", str(length))
                for name, value in headers.items():
                    conn.putheader(name, value)
                conn.endheaders()
                for buf in data:
                    conn.send(buf)
                resp = conn.getresponse()
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
                self._drop(conn, parts.scheme, host, parts.port)
                if attempt or fresh:
                    raise
                continue
            except BaseException:
                self._drop(conn, parts.scheme, host, parts.port)
                raise
            try:
                etag = resp.getheader("ETag")
                resp.read()  # empty, or a small error document: the connection is reusable
            except BaseException:
                self._drop(conn, parts.scheme, host, parts.port)
                raise
            if resp.status == 200:
                return PutReply(200, etag.strip('"') if etag else None)
            if resp.status in (409, 412):
                return PutReply(resp.status)
            log.debug("direct PUT answered %d, falling back to the SDK", resp.status)
            return PutReply(resp.status) if resp.status < 500 else None
        return None
