"""``S3Store.get_buffer``: the read path's direct GETs (segments/s3_direct.py) against
real S3 servers (moto's server and SeaweedFS): the same bytes and errors as ``get``,
without falling back to the SDK."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from segments.s3_direct import MAP_MIN
from segments.s3_store import S3Store
from segments.store import ObjectNotFoundError, PreconditionFailedError, open_store
from tests.fixtures.s3 import create_bucket

pytestmark = pytest.mark.integration


@pytest.fixture(params=["moto", "seaweedfs"], ids=["s3-moto", "s3-seaweedfs"])
async def direct(request: pytest.FixtureRequest) -> AsyncIterator[S3Store]:
    """A store whose SDK GET fails the test: every answer must come from the direct path."""
    endpoint = request.getfixturevalue(f"{request.param}_s3")
    bucket = await asyncio.to_thread(create_bucket, endpoint)
    s = open_store(endpoint.store_url(bucket, "pfx"))
    assert isinstance(s, S3Store)

    async def no_sdk_get(*args: Any, **kwargs: Any) -> bytes:
        raise AssertionError(f"fell back to the SDK GET: {args}")

    s.get = no_sdk_get  # type: ignore[method-assign]
    yield s
    await s.close()


async def test_whole_and_ranged_reads_are_the_stored_bytes(direct: S3Store) -> None:
    payload = bytes(range(256)) * 4096 + b"tail"  # ~1 MB: several socket reads
    assert len(payload) >= MAP_MIN > 300_000  # whole: into a mapping; ranged: a bytearray
    etag = await direct.put_if_absent("d/obj", [payload])
    whole = await direct.get_buffer("d/obj", if_match=etag)
    assert isinstance(whole, memoryview) and whole.readonly and whole == payload
    assert await direct.get_buffer("d/obj", 10, 20, etag) == payload[10:20]
    assert await direct.get_buffer("d/obj", 0, 5) == payload[:5]
    assert await direct.get_buffer("d/obj", len(payload) - 4) == b"tail"
    assert await direct.get_buffer("d/obj", 7, 7) == b""
    for _ in range(3):  # kept-alive connections are reused
        assert await direct.get_buffer("d/obj", 100, 300_000) == payload[100:300_000]


async def test_if_match_and_missing_objects(direct: S3Store) -> None:
    etag = await direct.put_if_absent("m/obj", [b"abcdef"])
    with pytest.raises(PreconditionFailedError):
        await direct.get_buffer("m/obj", 1, 3, hashlib.md5(b"else").hexdigest())
    with pytest.raises(PreconditionFailedError):
        await direct.get_buffer("m/obj", None, None, "0" * 32)
    with pytest.raises(ObjectNotFoundError):
        await direct.get_buffer("nope/obj")
    with pytest.raises(ObjectNotFoundError):
        await direct.get_buffer("nope/obj", 0, 10, etag)
    assert await direct.get_buffer("m/obj", 1, 3, etag) == b"bc"


async def test_parts_are_read_into_one_buffer(direct: S3Store) -> None:
    payload = bytes(range(256)) * 4096 + b"tail"
    etag = await direct.put_if_absent("p/obj", [payload])
    got = await direct.get_parts("p/obj", 0, len(payload), 300_000, etag)
    assert isinstance(got, memoryview) and got.readonly and got == payload
    got = await direct.get_parts("p/obj", 1000, 700_001, 250_000)  # uneven last part
    assert got == payload[1000:700_001]
    with pytest.raises(PreconditionFailedError):
        await direct.get_parts("p/obj", 0, 600_000, 250_000, "0" * 32)
    with pytest.raises(ObjectNotFoundError):
        await direct.get_parts("nope/obj", 0, 600_000, 250_000)
    assert await direct.get_parts("p/obj", 10, 10, 250_000) is None  # nothing to read


async def test_parts_of_a_range_key_are_its_range(direct: S3Store) -> None:
    """Parallel ranged GETs of a segment inside a shared object (segments/shared.py): the
    parts are counted from the range's start and end at its end."""
    payload = bytes(range(256)) * 4096
    etag = await direct.put_if_absent("ns/@shared/0-ab-000000000001.kfm", [payload])
    key = "ns/t/0/~0-ab-000000000001.kfm#5000+700000"
    got = await direct.get_parts(key, 0, 700_000, 250_000, etag)
    assert got == payload[5000:705_000]
    got = await direct.get_parts(key, 100, 800_000, 300_000)  # clamped to the range
    assert got == payload[5100:705_000]
    assert await direct.get_buffer(key, 10, 20) == payload[5010:5020]
