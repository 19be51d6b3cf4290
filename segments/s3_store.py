"""``S3Store``: the object store on any S3 API (AWS S3, MinIO, SeaweedFS) via aioboto3.

URL form: ``s3://BUCKET/PREFIX?endpoint=http://127.0.0.1:8333&region=us-east-1&path_style=true``
with optional ``access_key``/``secret_key`` parameters; without them the usual AWS
credential chain applies (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, profiles, ...).
``ca_bundle=PATH`` verifies an https endpoint against that PEM bundle (a private CA;
``--s3-ca-bundle``).

One long-lived client is created on first use and closed by ``close()``. Segment PUTs and
reads bypass the SDK's request and body handling where they can (``direct_puts``,
``direct_gets``: segments/s3_direct_put.py, segments/s3_direct.py). ETags are returned
without quotes (the hex MD5 for single-part PUTs; ``LocalStore``'s are CRC-32C based).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import aioboto3
from aiobotocore.config import AioConfig
from botocore.exceptions import BotoCoreError, ClientError

from segments.s3_direct import DirectGetter
from segments.s3_direct_put import EXPIRES_S, DirectPutter, PutReply, checksum_header, data_crc
from segments.shared import is_range_key, resolve, translate
from segments.store import (
    Buffer,
    ObjectExistsError,
    ObjectInfo,
    ObjectNotFoundError,
    PreconditionFailedError,
    StoreError,
)

log = logging.getLogger(__name__)

_NOT_FOUND = {"NoSuchKey", "404", "NotFound", "NoSuchBucket"}
_PRECONDITION = {"PreconditionFailed", "412"}
_CONFLICT = {"ConditionalRequestConflict", "409"}
_BAD_RANGE = {"InvalidRange", "416"}
# a body that does not match its x-amz-checksum-crc32c (AWS, SeaweedFS: BadDigest; MinIO:
# XAmzContentChecksumMismatch; a malformed value: InvalidDigest)
_CHECKSUM_MISMATCH = {"BadDigest", "XAmzContentChecksumMismatch", "InvalidDigest"}
# a store without the checksum header (Backblaze B2: InvalidArgument "Unsupported header";
# Cloudflare R2: 501 NotImplemented; others: InvalidRequest)
_CHECKSUM_UNSUPPORTED = {"InvalidArgument", "InvalidRequest", "NotImplemented", "501"}
_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def _code(exc: ClientError) -> str:
    err = exc.response.get("Error", {})
    code = str(err.get("Code", ""))
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code or str(status)


def _truthy(value: str) -> bool:
    return value.lower() in ("1", "true", "yes", "on")


def _aio_config(endpoint_url: str | None, path_style: bool, max_connections: int) -> AioConfig:
    """The SDK's configuration. Over https (TLS protects the body) PUTs carry no SHA-256
    of the payload: botocore would hash every segment on the event loop (~10% of S3
    produce samples; docs/benchmarks.md). Over plain http the signature stays the body's
    only check."""
    signing = not (endpoint_url or "https://").startswith("https://")
    return AioConfig(
        s3={
            "addressing_style": "path" if path_style else "auto",
            "payload_signing_enabled": signing,
        },
        retries={"max_attempts": 3, "mode": "standard"},
        max_pool_connections=max_connections,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )


class S3Store:
    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        path_style: bool = True,
        max_connections: int = 64,
        ca_bundle: str | None = None,
        parallel_gets: bool = False,
        direct_gets: bool = True,
        direct_puts: bool = True,
    ) -> None:
        if not bucket:
            raise ValueError("S3Store needs a bucket")
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.endpoint_url = endpoint_url
        # ``parallel_gets=true`` in the URL: whole segments come as concurrent ranged GETs
        # (broker/segment_loader.py), for stores whose single stream is slow (AWS S3: tens
        # of MB/s per connection). Off by default: on SeaweedFS over loopback one stream
        # was faster (573 vs 364 MB/s for 13 MB objects; docs/benchmarks.md).
        self.parallel_ranged_gets = parallel_gets
        # ``direct_gets`` (default on; ``direct_gets=false`` in the URL: off): the read
        # path's segment GETs bypass the SDK's body handling (segments/s3_direct.py). Not
        # through a proxy (the SDK's proxy settings are not applied there).
        self._direct: DirectGetter | None = None
        if direct_gets and not any(os.environ.get(v) for v in _PROXY_VARS):
            self._direct = DirectGetter(ca_bundle)
        # ``direct_puts`` (default on; ``direct_puts=false``: off): segment PUTs signed by
        # the SDK, sent by ``http.client`` (segments/s3_direct_put.py); path-style only (the
        # object URL is built here), never through a proxy
        self._puts: DirectPutter | None = None
        if direct_puts and path_style and not any(os.environ.get(v) for v in _PROXY_VARS):
            self._puts = DirectPutter(ca_bundle)
        self.region = region
        self._access_key = access_key
        self._secret_key = secret_key
        self.ca_bundle = ca_bundle
        self._config = _aio_config(endpoint_url, path_style, max_connections)
        # False once the store refused the SDK's PUT with ``x-amz-checksum-crc32c`` for a
        # reason other than a mismatch (``_sdk_put``): later ones go without it
        self._sdk_checksums = True
        self.list_page_size = 1000  # keys per ListObjectsV2 page (S3's maximum)
        self._client: Any = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._lock = asyncio.Lock()

    @classmethod
    def from_url(cls, url: str) -> S3Store:
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise ValueError(f"not an s3:// URL: {url!r} (want s3://BUCKET[/PREFIX][?...])")
        q = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        return cls(
            bucket=parts.netloc,
            prefix=parts.path,
            endpoint_url=q.get("endpoint"),
            region=q.get("region"),
            access_key=q.get("access_key"),
            secret_key=q.get("secret_key"),
            path_style=_truthy(q.get("path_style", "true")),
            ca_bundle=q.get("ca_bundle"),
            parallel_gets=_truthy(q.get("parallel_gets", "false")),
            direct_gets=_truthy(q.get("direct_gets", "true")),
            direct_puts=_truthy(q.get("direct_puts", "true")),
        )

    def __repr__(self) -> str:
        return f"S3Store({self.bucket!r}, prefix={self.prefix!r}, endpoint={self.endpoint_url!r})"

    async def _get_client(self) -> Any:
        if self._client is not None:
            return self._client
        async with self._lock:
            if self._client is None:
                session = aioboto3.Session(
                    aws_access_key_id=self._access_key,
                    aws_secret_access_key=self._secret_key,
                    region_name=self.region,
                )
                stack = contextlib.AsyncExitStack()
                self._client = await stack.enter_async_context(
                    session.client(
                        "s3",
                        endpoint_url=self.endpoint_url,
                        config=self._config,
                        verify=self.ca_bundle,
                    )
                )
                self._stack = stack
        return self._client

    def _key(self, key: str) -> str:
        return self.prefix + key

    async def warm(self) -> None:
        """Create the client now (botocore loads its JSON service models: ~0.3 s of CPU)
        rather than in the first read after a start (docs/benchmarks.md, cold reads)."""
        await self._get_client()

    # ------------------------------------------------------------------ ObjectStore

    async def put_if_absent(
        self, key: str, data: Sequence[Buffer], *, crc32c: int | None = None
    ) -> str:
        """``ObjectStore.put_if_absent``. ``crc32c`` (the concatenation's CRC-32C) is sent
        as ``x-amz-checksum-crc32c`` without hashing the bytes, by the direct PUT and by the
        SDK's (``_sdk_put``); the server checks it. A direct PUT refused with a 4xx (a wrong
        CRC: 400) is hashed here once, and if the bytes do not match ``crc32c`` the PUT
        fails (StoreError) instead of falling back to the SDK's PUT, so nothing is stored
        whose CRC the caller did not vouch for; the SDK's PUT refused for a mismatch fails
        too. A store that refuses the header itself gets the PUT without it, once the bytes
        were hashed here and matched (docs/operations.md, "Direct PUTs")."""
        if is_range_key(key):
            raise StoreError(f"put {key}: a range of a shared object cannot be written")
        refused = None
        verified = False
        if (puts := self._puts) is not None:
            reply = await self._direct_put(puts, key, data, crc32c)
            if reply is not None and reply.status == 200:
                if reply.etag is not None:
                    return reply.etag
                info = await self.head(key)  # a server that sent no ETag: ask for it
                if info is not None:
                    return info.etag
            elif reply is not None and reply.status in (409, 412):
                raise ObjectExistsError(key)
            elif reply is not None:
                refused = reply.status
                if crc32c is not None and await asyncio.to_thread(data_crc, data) != crc32c:
                    raise StoreError(f"put {key}: the bytes do not match their CRC-32C")
                verified = True
        etag = await self._sdk_put(key, data, crc32c, verified)
        if refused is not None and puts is not None and self._puts is puts:
            # the direct form was refused where the SDK's succeeded (a store without the
            # checksum header, say): the SDK for every later PUT
            log.warning("direct S3 PUTs refused (HTTP %d), using the SDK's PUTs", refused)
            self._puts = None
            puts.close()
        return etag

    async def _direct_put(
        self, puts: DirectPutter, key: str, data: Sequence[Buffer], crc: int | None = None
    ) -> PutReply | None:
        """A direct conditional PUT (segments/s3_direct_put.py); None: use the SDK's."""
        client = await self._get_client()
        try:
            # the SDK's signer (its credentials, refreshed as for its own requests)
            auth = await client._request_signer.get_auth_instance(  # noqa: SLF001
                "s3", client.meta.region_name, "s3v4-query", expires=EXPIRES_S
            )
        except (BotoCoreError, AttributeError, TypeError) as exc:
            log.debug("no signer for direct PUTs, using the SDK's: %s", exc)
            return None
        base = str(client.meta.endpoint_url).rstrip("/")
        url = f"{base}/{quote(self.bucket, safe='')}/{quote(self._key(key), safe='/~')}"
        return await puts.put(url, auth, data, crc)

    async def _sdk_put(
        self, key: str, data: Sequence[Buffer], crc: int | None = None, verified: bool = False
    ) -> str:
        """The SDK's conditional PUT, with ``crc`` (the bytes' CRC-32C) as its checksum
        unless the store refused that header before; ``verified``: the bytes were already
        hashed here and matched ``crc``."""
        mismatch = f"put {key}: the bytes do not match their CRC-32C"
        if crc is not None and not self._sdk_checksums:
            if not verified and await asyncio.to_thread(data_crc, data) != crc:
                raise StoreError(mismatch)
            crc = None
        body = data[0] if len(data) == 1 and isinstance(data[0], bytes) else b"".join(data)
        extra = {} if crc is None else {"ChecksumCRC32C": checksum_header(data, crc)}
        client = await self._get_client()
        try:
            resp = await client.put_object(
                Bucket=self.bucket, Key=self._key(key), Body=body, IfNoneMatch="*", **extra
            )
        except ClientError as exc:
            code = _code(exc)
            if code in _PRECONDITION or code in _CONFLICT:
                raise ObjectExistsError(key) from None
            if crc is not None and code in _CHECKSUM_MISMATCH:
                raise StoreError(f"{mismatch} ({code})") from exc
            if crc is None or code not in _CHECKSUM_UNSUPPORTED:
                raise StoreError(f"put {key}: {code}") from exc
            # perhaps a store without x-amz-checksum-crc32c: the bytes hashed here, then
            # the PUT without it (and every later one, hashed here first, once one passed)
            if not verified and await asyncio.to_thread(data_crc, data) != crc:
                raise StoreError(mismatch) from exc
            etag = await self._sdk_put(key, data)
            if self._sdk_checksums:
                self._sdk_checksums = False
                log.warning("S3 PUTs with a checksum refused (%s): sent without one", code)
            return etag
        except BotoCoreError as exc:
            raise StoreError(f"put {key}: {exc}") from exc
        return str(resp["ETag"]).strip('"')

    async def get(
        self,
        key: str,
        start: int | None = None,
        end: int | None = None,
        if_match: str | None = None,
    ) -> bytes:
        key, start, end = translate(key, start, end)  # a range of a shared object
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key)}
        if start is not None or end is not None:
            lo = max(0, start or 0)
            if end is not None and end <= lo:
                return b""
            kwargs["Range"] = f"bytes={lo}-" if end is None else f"bytes={lo}-{end - 1}"
        if if_match is not None:
            kwargs["IfMatch"] = f'"{if_match.strip(chr(34))}"'
        client = await self._get_client()
        try:
            resp = await client.get_object(**kwargs)
            async with resp["Body"] as stream:
                return bytes(await stream.read())
        except ClientError as exc:
            code = _code(exc)
            if code in _NOT_FOUND:
                raise ObjectNotFoundError(key) from None
            if code in _PRECONDITION:
                raise PreconditionFailedError(key) from None
            if code in _BAD_RANGE:
                return b""
            raise StoreError(f"get {key}: {code}") from exc
        except BotoCoreError as exc:
            raise StoreError(f"get {key}: {exc}") from exc

    async def get_buffer(
        self,
        key: str,
        start: int | None = None,
        end: int | None = None,
        if_match: str | None = None,
    ) -> Buffer:
        """``get`` for the read path: the bytes as a read-only buffer, by a direct GET
        (segments/s3_direct.py) when it can, else by ``get``."""
        key, start, end = translate(key, start, end)  # a range of a shared object
        lo = max(0, start or 0)
        ranged = start is not None or end is not None
        if end is not None and end <= lo:
            return b""
        if self._direct is None:
            return await self.get(key, start, end, if_match)
        url = await self._presign(key)
        headers = {}
        if ranged:
            headers["Range"] = f"bytes={lo}-" if end is None else f"bytes={lo}-{end - 1}"
        if if_match is not None:
            headers["If-Match"] = f'"{if_match.strip(chr(34))}"'
        expect = end - lo if ranged and end is not None else None
        reply = await self._direct.get(url, headers, expect)
        if reply is None or (ranged and end is None and reply.status == 200 and lo):
            return await self.get(key, start, end, if_match)  # the SDK's retries and errors
        if reply.status == 404:
            raise ObjectNotFoundError(key)
        if reply.status == 412:
            raise PreconditionFailedError(key)
        if reply.status == 416 or reply.body is None:
            return b""
        return reply.body

    async def get_parts(
        self, key: str, lo: int, hi: int, part: int, if_match: str | None = None
    ) -> Buffer | None:
        """Bytes ``[lo, hi)`` of ``key`` as concurrent direct ranged GETs of ``part`` bytes,
        each read straight into its place in one buffer (no join). None when the direct
        path cannot serve them (the caller reads them another way)."""
        key, start, end = translate(key, lo, hi)  # a range of a shared object
        lo, hi = start or 0, end if end is not None else hi
        if self._direct is None or hi <= lo:
            return None
        url = await self._presign(key)
        view = memoryview(bytearray(hi - lo))
        spans = [(a, min(a + part, hi)) for a in range(lo, hi, part)]
        match = {} if if_match is None else {"If-Match": f'"{if_match.strip(chr(34))}"'}
        replies = await asyncio.gather(
            *(
                self._direct.get(url, {"Range": f"bytes={a}-{b - 1}", **match}, b - a,
                                 view[a - lo : b - lo])
                for a, b in spans
            )
        )  # fmt: skip
        for r in replies:
            if r is not None and r.status == 404:
                raise ObjectNotFoundError(key)
            if r is not None and r.status == 412:
                raise PreconditionFailedError(key)
            if r is None or r.status != 206:
                return None
        return view.toreadonly()

    async def _presign(self, key: str) -> str:
        client = await self._get_client()
        try:
            url: str = await client.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": self._key(key)}, ExpiresIn=900
            )
        except (ClientError, BotoCoreError) as exc:
            raise StoreError(f"get {key}: {exc}") from exc
        return url

    async def head(self, key: str) -> ObjectInfo | None:
        if (span := resolve(key)) is not None:  # a range of a shared object: its size
            info = await self.head(span[0])
            return None if info is None else replace(info, key=key, size=span[2])
        client = await self._get_client()
        try:
            resp = await client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            code = _code(exc)
            if code in _NOT_FOUND:
                return None
            raise StoreError(f"head {key}: {code}") from exc
        except BotoCoreError as exc:
            raise StoreError(f"head {key}: {exc}") from exc
        modified = resp.get("LastModified")
        return ObjectInfo(
            key,
            int(resp["ContentLength"]),
            str(resp["ETag"]).strip('"'),
            modified.timestamp() if modified is not None else 0.0,
        )

    async def delete(self, key: str) -> None:
        if is_range_key(key):  # only the shared sweep deletes shared objects
            raise StoreError(f"delete {key}: a range of a shared object cannot be deleted")
        client = await self._get_client()
        try:
            await client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            code = _code(exc)
            if code in _NOT_FOUND and code != "NoSuchBucket":
                return
            raise StoreError(f"delete {key}: {code}") from exc
        except BotoCoreError as exc:
            raise StoreError(f"delete {key}: {exc}") from exc

    async def list(self, prefix: str) -> list[ObjectInfo]:
        client = await self._get_client()
        out: list[ObjectInfo] = []
        strip = len(self.prefix)
        try:
            paginator = client.get_paginator("list_objects_v2")
            pages = paginator.paginate(
                Bucket=self.bucket,
                Prefix=self._key(prefix),
                PaginationConfig={"PageSize": self.list_page_size},
            )
            async for page in pages:
                for obj in page.get("Contents", ()):
                    modified = obj.get("LastModified")
                    out.append(
                        ObjectInfo(
                            obj["Key"][strip:],
                            int(obj["Size"]),
                            obj["ETag"].strip('"'),
                            modified.timestamp() if modified is not None else 0.0,
                        )
                    )
        except ClientError as exc:
            raise StoreError(f"list {prefix}: {_code(exc)}") from exc
        except BotoCoreError as exc:
            raise StoreError(f"list {prefix}: {exc}") from exc
        out.sort(key=lambda i: i.key)
        return out

    async def close(self) -> None:
        direct, self._direct = self._direct, None
        if direct is not None:
            direct.close()
        puts, self._puts = self._puts, None
        if puts is not None:
            puts.close()
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.aclose()
