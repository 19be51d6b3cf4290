"""The object-store interface segments are written to and read from.

Implementations: ``segments.local_store.LocalStore`` (a directory, ``file://PATH``) and
``segments.s3_store.S3Store`` (aioboto3, ``s3://BUCKET/PREFIX?endpoint=URL&region=R``),
chosen by ``open_store(url)`` and imported lazily (the implementations import this
interface: the factory's lazy import is the one import cycle the package allows).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit

Buffer = bytes | bytearray | memoryview


class StoreError(Exception):
    """Base class of object-store failures (I/O, auth, network)."""


class ObjectExistsError(StoreError):
    """A conditional PUT (If-None-Match: *) found the key already present."""


class ObjectNotFoundError(StoreError):
    """The key does not exist."""


class PreconditionFailedError(StoreError):
    """A GET with If-Match found a different ETag."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    etag: str
    # when the object was written (unix seconds; 0.0 when the store does not say): sweeps
    # of unreferenced objects count their grace period from this, never from when the
    # sweeper first noticed an object (docs/format.md, "Object keys")
    modified: float = 0.0


@dataclass(frozen=True, slots=True)
class PutItem:
    """One object of a batch PUT (``put_all``): ``put_if_absent``'s arguments."""

    key: str
    data: Sequence[Buffer]
    crc32c: int | None = None


@runtime_checkable
class ObjectStore(Protocol):
    async def put_if_absent(
        self, key: str, data: Sequence[Buffer], *, crc32c: int | None = None
    ) -> str:
        """Write the concatenation of ``data`` at ``key`` only if it does not exist.

        Returns the ETag. Raises ObjectExistsError if the key exists.

        ``crc32c``: the CRC-32C of the concatenation, when the caller already has it
        (``segments.format.BuiltSegment.crc32c``), so that the store does not hash the
        bytes again for its ETag or checksum. It must be derived from the very bytes
        passed (never from what they should be); without it the store computes it. What
        each store does with a wrong one is in its docstring (the S3 store's server
        refuses the object; the local store's ETag would not be its content's CRC).
        """
        ...

    async def get(
        self,
        key: str,
        start: int | None = None,
        end: int | None = None,
        if_match: str | None = None,
    ) -> bytes:
        """Read ``[start, end)`` of the object (whole object when both are None).

        Raises ObjectNotFoundError, PreconditionFailedError (etag mismatch).
        """
        ...

    async def head(self, key: str) -> ObjectInfo | None: ...

    async def delete(self, key: str) -> None:
        """Delete ``key``; deleting a missing key is not an error."""
        ...

    async def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix``, sorted by key."""
        ...

    async def close(self) -> None: ...


def batches_puts(store: object) -> bool:
    """Whether ``store``'s class has ``put_many_if_absent(items, concurrency)``: a batch
    PUT (``LocalStore``: one durability barrier for the whole batch,
    ``segments/local_batch.py``). Asked of the class, so that a wrapper which forwards
    unknown attributes to an inner store never sends a batch past its own
    ``put_if_absent``."""
    return callable(getattr(type(store), "put_many_if_absent", None))


def paces_puts(store: object) -> bool:
    """Whether ``store``'s class has ``put_paced_if_absent(key, data, *, crc32c)``: a PUT
    for background work that reaches the disk in pieces (``LocalStore``), so that the
    write path's PUTs to the same disk do not queue behind all of it. Asked of the class,
    as ``batches_puts``."""
    return callable(getattr(type(store), "put_paced_if_absent", None))


async def put_background(
    store: ObjectStore, key: str, data: Sequence[Buffer], *, crc32c: int | None = None
) -> str:
    """``put_if_absent`` for work off the acknowledgement path (merges): paced where the
    store paces its writes (``paces_puts``); same result and guarantees either way."""
    if paces_puts(store):
        etag: str = await store.put_paced_if_absent(key, data, crc32c=crc32c)  # type: ignore[attr-defined]
        return etag
    return await store.put_if_absent(key, data, crc32c=crc32c)


async def put_all(
    store: ObjectStore, items: Sequence[PutItem], concurrency: int
) -> list[str | BaseException]:
    """Every item written as ``put_if_absent`` writes it; per item its ETag or its error
    (each item succeeds or fails alone): one batch PUT where the store has it
    (``batches_puts``), else concurrent ``put_if_absent`` calls, ``concurrency`` at most."""
    if len(items) > 1 and batches_puts(store):
        results: list[str | BaseException] = await store.put_many_if_absent(  # type: ignore[attr-defined]
            items, concurrency
        )
        return results
    return await put_each(store, items, concurrency)


async def put_each(
    store: ObjectStore, items: Sequence[PutItem], concurrency: int
) -> list[str | BaseException]:
    """``put_all`` as concurrent ``put_if_absent`` calls, ``concurrency`` at most."""
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(item: PutItem) -> str:
        async with sem:
            return await store.put_if_absent(item.key, item.data, crc32c=item.crc32c)

    return await asyncio.gather(*(one(i) for i in items), return_exceptions=True)


def check_store_url(url: str) -> None:
    """ValueError, naming what is wrong, when ``open_store`` would refuse ``url``; no I/O
    and nothing created (a broker checks its flags with it before it starts anything)."""
    if url.startswith("file://") or "://" not in url:
        return
    if url.startswith("s3://"):
        if not urlsplit(url).netloc:
            raise ValueError(f"not an s3:// URL: {url!r} (want s3://BUCKET[/PREFIX][?...])")
        return
    raise ValueError(f"unsupported object store URL {url!r} (use file:// or s3://)")


def open_store(url: str) -> ObjectStore:
    """Open an object store from a URL: ``file://PATH`` or ``s3://BUCKET/PREFIX?...``."""
    check_store_url(url)
    if url.startswith("s3://"):
        from segments.s3_store import S3Store

        return S3Store.from_url(url)
    from segments.local_store import LocalStore

    return LocalStore.from_url(url)
