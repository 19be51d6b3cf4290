"""``LocalStore.get_buffer``: large reads as read-only mappings of the object's file."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from segments.local_store import MAP_MIN, LocalStore
from segments.store import ObjectNotFoundError, PreconditionFailedError


async def test_large_reads_are_read_only_views_of_the_file(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    data = os.urandom(3 * MAP_MIN + 17)
    etag = await store.put_if_absent("t/0/seg", [data])
    whole = await store.get_buffer("t/0/seg", if_match=etag)
    assert isinstance(whole, memoryview) and whole.readonly and whole == data
    part = await store.get_buffer("t/0/seg", 5, 5 + MAP_MIN)
    assert isinstance(part, memoryview) and part == data[5 : 5 + MAP_MIN]
    assert await store.get_buffer("t/0/seg", MAP_MIN) == data[MAP_MIN:]
    odd = await store.get_buffer("t/0/seg", 4097, 4097 + MAP_MIN)  # a page-unaligned start
    assert isinstance(odd, memoryview) and odd == data[4097 : 4097 + MAP_MIN]
    assert await store.get_buffer("t/0/seg", 2 * MAP_MIN, 10 * MAP_MIN) == data[2 * MAP_MIN :]
    small = await store.get_buffer("t/0/seg", 10, 20, etag)
    assert small == data[10:20] and not isinstance(small, memoryview)  # get's bytes
    await store.delete("t/0/seg")  # a mapping outlives the file's unlink
    assert whole == data and part == data[5 : 5 + MAP_MIN]


async def test_if_match_and_missing_objects(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    await store.put_if_absent("t/0/seg", [os.urandom(2 * MAP_MIN)])
    with pytest.raises(PreconditionFailedError):
        await store.get_buffer("t/0/seg", if_match=hashlib.md5(b"x").hexdigest())
    with pytest.raises(ObjectNotFoundError):
        await store.get_buffer("t/0/none")
    await store.put_if_absent("t/0/empty", [b""])
    assert await store.get_buffer("t/0/empty") == b""
