"""One contract suite for every ObjectStore. Here: LocalStore (and store-specific unit
tests); tests/integration/segments/test_store_contract_s3.py runs the same contract
against S3Store on moto's server and on SeaweedFS."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import crc32c as crc_pkg
import pytest

from segments.local_files import ETAG_XATTR
from segments.local_store import TMP_MARKER, LocalStore, crc_etag
from segments.s3_store import S3Store
from segments.store import (
    Buffer,
    ObjectExistsError,
    ObjectNotFoundError,
    ObjectStore,
    PreconditionFailedError,
    PutItem,
    StoreError,
    open_store,
    put_all,
)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ObjectStore]:
    """LocalStore; tests/integration/segments/test_store_contract_s3.py runs this module's
    tests again against S3Store on moto's server and on SeaweedFS."""
    s = open_store(f"file://{tmp_path}/objects")
    assert isinstance(s, LocalStore)
    yield s
    await s.close()


async def test_put_if_absent_is_exclusive(store: ObjectStore) -> None:
    data: list[Buffer] = [b"hello ", memoryview(b"world"), bytearray(b"!")]
    etag = await store.put_if_absent("ns/t/0/a.kfs", data)
    assert etag and (await store.head("ns/t/0/a.kfs")).etag == etag  # type: ignore[union-attr]
    with pytest.raises(ObjectExistsError):
        await store.put_if_absent("ns/t/0/a.kfs", [b"other"])
    assert await store.get("ns/t/0/a.kfs") == b"hello world!"


async def test_concurrent_puts_one_winner(store: ObjectStore) -> None:
    results = await asyncio.gather(
        *(store.put_if_absent("race/k", [f"writer-{i}".encode()]) for i in range(4)),
        return_exceptions=True,
    )
    wins = [r for r in results if isinstance(r, str)]
    assert len(wins) == 1
    assert all(isinstance(r, ObjectExistsError) for r in results if not isinstance(r, str))
    assert await store.get("race/k") in {f"writer-{i}".encode() for i in range(4)}
    assert (await store.head("race/k")).etag == wins[0]  # type: ignore[union-attr]


async def test_ranged_gets(store: ObjectStore) -> None:
    payload = bytes(range(256)) * 4
    await store.put_if_absent("r/obj", [payload])
    assert await store.get("r/obj", 10, 20) == payload[10:20]
    assert await store.get("r/obj", 1000) == payload[1000:]
    assert await store.get("r/obj", None, 5) == payload[:5]
    assert await store.get("r/obj", 1000, 5000) == payload[1000:]
    assert await store.get("r/obj", 7, 7) == b""


async def test_range_keys_read_a_shared_objects_segment(store: ObjectStore) -> None:
    """A range key (segments/shared.py) reads its byte range of the shared object, relative
    and clamped to the range, with the object's ETag; it cannot be written or deleted."""
    payload = bytes(range(256)) * 8
    etag = await store.put_if_absent("ns/@shared/1-ab-000000000007.kfm", [payload])
    key = "ns/orders/3/~1-ab-000000000007.kfm#100+50"
    assert await store.get(key) == payload[100:150]
    assert await store.get(key, 10, 20) == payload[110:120]
    assert await store.get(key, 40) == payload[140:150]
    assert await store.get(key, None, 5, if_match=etag) == payload[100:105]
    assert await store.get(key, 45, 500) == payload[145:150]  # clamped to the range
    assert await store.get(key, 60, 70) == b""
    assert bytes(await _get_buffer(store, key, 0, 50)) == payload[100:150]
    info = await store.head(key)
    assert info is not None and (info.key, info.size, info.etag) == (key, 50, etag)
    with pytest.raises(PreconditionFailedError):
        await store.get(key, 0, 5, if_match=hashlib.md5(b"else").hexdigest())
    with pytest.raises(StoreError):
        await store.delete(key)
    with pytest.raises(StoreError):
        await store.put_if_absent("ns/orders/3/~1-ab-000000000008.kfm#0+5", [b"abcde"])
    assert await store.get("ns/@shared/1-ab-000000000007.kfm") == payload  # still there
    missing = "ns/orders/3/~1-ab-000000000009.kfm#0+10"
    assert await store.head(missing) is None
    with pytest.raises(ObjectNotFoundError):
        await store.get(missing)
    assert [i.key for i in await store.list("ns/orders/")] == []


async def _get_buffer(store: ObjectStore, key: str, start: int, end: int) -> Buffer:
    get = getattr(store, "get_buffer", store.get)
    data: Buffer = await get(key, start, end)
    return data


async def test_if_match(store: ObjectStore) -> None:
    etag = await store.put_if_absent("m/obj", [b"abcdef"])
    assert await store.get("m/obj", 1, 3, if_match=etag) == b"bc"
    with pytest.raises(PreconditionFailedError):
        await store.get("m/obj", 1, 3, if_match=hashlib.md5(b"else").hexdigest())
    await store.delete("m/obj")
    etag2 = await store.put_if_absent("m/obj", [b"ABCDEF"])
    assert etag2 != etag
    with pytest.raises(PreconditionFailedError):
        await store.get("m/obj", if_match=etag)  # a replaced object is fenced off


async def test_put_with_its_crc32c(store: ObjectStore) -> None:
    """A put given the content's CRC-32C (``put_if_absent``'s ``crc32c``: the broker's
    segments) writes the same object, with the same ETag, as one that computes it."""
    parts: list[Buffer] = [bytes(range(256)) * 300, memoryview(b"middle"), bytearray(b"end")]
    whole = b"".join(parts)
    crc = crc_pkg.crc32c(whole)
    plain = await store.put_if_absent("crc/plain", parts)
    given = await store.put_if_absent("crc/given", parts, crc32c=crc)
    assert given == plain
    assert await store.get("crc/given") == whole
    info = await store.head("crc/given")
    assert info is not None and info.etag == given and info.size == len(whole)
    assert await store.get("crc/given", 0, 4, if_match=given) == whole[:4]
    with pytest.raises(ObjectExistsError):
        await store.put_if_absent("crc/given", [b"other"], crc32c=crc_pkg.crc32c(b"other"))
    assert await store.get("crc/given") == whole


async def test_put_all_each_item_alone(store: ObjectStore) -> None:
    """A batch PUT (``put_all``: the local store's one-barrier batch, concurrent puts on
    S3) writes every item as ``put_if_absent`` would, and each item succeeds or fails
    alone: a key that exists, and two items with one key (one wins), fail; the rest are
    written whole, each with the ETag a single put gives the same bytes."""
    await store.put_if_absent("batch/p1/taken", [b"first"])
    payloads = {f"batch/p{i}/seg": bytes([i]) * (1000 + 4096 * i) for i in range(6)}
    items = [PutItem(k, [memoryview(v)], crc_pkg.crc32c(v)) for k, v in payloads.items()]
    items.insert(2, PutItem("batch/p1/taken", [b"second"]))
    items += [PutItem("batch/twice", [b"one"]), PutItem("batch/twice", [b"two"])]
    results = await put_all(store, items, concurrency=4)
    assert len(results) == len(items)
    for item, res in zip(items, results, strict=True):
        if item.key == "batch/p1/taken":
            assert isinstance(res, ObjectExistsError)
        elif item.key in payloads:
            assert isinstance(res, str), res
            info = await store.head(item.key)
            assert info is not None and info.etag == res
            assert await store.get(item.key, if_match=res) == payloads[item.key]
    twice = results[-2:]
    assert sum(isinstance(r, str) for r in twice) == 1
    assert sum(isinstance(r, ObjectExistsError) for r in twice) == 1
    assert await store.get("batch/twice") == (b"one" if isinstance(twice[0], str) else b"two")
    assert await store.get("batch/p1/taken") == b"first"
    single = await store.put_if_absent("batch/single", [payloads["batch/p3/seg"]])
    assert results[list(payloads).index("batch/p3/seg") + 1] == single  # same bytes, same ETag
    assert sorted(i.key for i in await store.list("batch/")) == sorted(
        [*payloads, "batch/p1/taken", "batch/twice", "batch/single"]
    )


async def test_missing_objects(store: ObjectStore) -> None:
    with pytest.raises(ObjectNotFoundError):
        await store.get("nope/obj")
    with pytest.raises(ObjectNotFoundError):
        await store.get("nope/obj", 0, 10, if_match="abc")
    assert await store.head("nope/obj") is None
    await store.delete("nope/obj")  # not an error


async def test_head_list_delete(store: ObjectStore) -> None:
    keys = ["default/t/0/segment-2.kfs", "default/t/0/segment-1.kfs", "default/t/1/x", "other/y"]
    etags = {k: await store.put_if_absent(k, [k.encode()]) for k in keys}
    info = await store.head("default/t/1/x")
    assert (
        info is not None
        and info.size == len("default/t/1/x")
        and info.etag == etags["default/t/1/x"]
    )
    listed = await store.list("default/t/0/")
    assert [i.key for i in listed] == ["default/t/0/segment-1.kfs", "default/t/0/segment-2.kfs"]
    assert [i.etag for i in listed] == [etags[i.key] for i in listed]
    assert [i.key for i in await store.list("default/t/0/segment-2")] == [keys[0]]
    assert len(await store.list("default/")) == 3
    assert len(await store.list("")) == 4
    assert await store.list("missing/") == []
    await store.delete("default/t/0/segment-1.kfs")
    assert [i.key for i in await store.list("default/t/0/")] == [keys[0]]
    assert await store.head("default/t/0/segment-1.kfs") is None


async def test_list_paginates(store: ObjectStore) -> None:
    n = 25
    if isinstance(store, S3Store):
        store.list_page_size = 7  # 4 pages
    await asyncio.gather(*(store.put_if_absent(f"p/k{i:05d}", [b"x"]) for i in range(n)))
    listed = await store.list("p/")
    assert [i.key for i in listed] == [f"p/k{i:05d}" for i in range(n)]


# ---------------------------------------------------------------------------- local only


async def test_local_put_leaves_no_temp_files(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    await store.put_if_absent("a/b/c", [b"1"])
    with pytest.raises(ObjectExistsError):
        await store.put_if_absent("a/b/c", [b"2"])
    assert sorted(os.listdir(tmp_path / "a" / "b")) == ["c"]
    (tmp_path / "a" / "b" / f".c{TMP_MARKER}dead").write_bytes(b"half")  # a crash leftover
    assert [i.key for i in await store.list("a/")] == ["a/b/c"]


async def test_local_etag_survives_restart(tmp_path: Path) -> None:
    etag = await LocalStore(str(tmp_path)).put_if_absent("k", [b"payload"])
    fresh = LocalStore(str(tmp_path))  # no remembered etags: hashes the file
    assert await fresh.get("k", 0, 3, if_match=etag) == b"pay"
    info = await fresh.head("k")
    assert info is not None and info.etag == etag


async def test_local_put_trusts_the_crc_given(tmp_path: Path) -> None:
    """The local store does not hash what it is given a CRC for (the pass it saves), so
    the ETag carries that CRC (segments/local_store.py, ``put_if_absent``): the broker
    passes only CRCs derived from verified bytes. A wrong one stays consistent where it
    was recorded, and a store that hashes the file (its recorded ETag gone) fences the
    old ETag off rather than reading silently."""
    store = LocalStore(str(tmp_path))
    data = b"payload" * 100
    wrong = crc_pkg.crc32c(data) ^ 0xFF
    etag = await store.put_if_absent("k", [data], crc32c=wrong)
    assert etag == crc_etag(wrong, len(data))
    assert (await store.head("k")).etag == etag  # type: ignore[union-attr]
    try:
        os.removexattr(tmp_path / "k", ETAG_XATTR)
    except OSError:
        pass  # no xattrs here: the fresh store hashes the file anyway
    fresh = LocalStore(str(tmp_path))
    with pytest.raises(PreconditionFailedError):
        await fresh.get("k", 0, 3, if_match=etag)
    assert (await fresh.head("k")).etag == crc_etag(crc_pkg.crc32c(data), len(data))  # type: ignore[union-attr]


async def test_local_rejects_escaping_keys(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path / "root"))
    for key in ("../x", "/abs", "a//b", "a/./b", ""):
        with pytest.raises(ValueError):
            await store.put_if_absent(key, [b"x"])


def test_local_from_url_relative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = LocalStore.from_url("file://./data")
    assert store.root == str(tmp_path / "data") and (tmp_path / "data").is_dir()


def test_s3_from_url_parses_parameters() -> None:
    s = S3Store.from_url(
        "s3://bucket/some/prefix/?endpoint=http://127.0.0.1:8333&region=eu-west-1"
        "&path_style=false&access_key=AK&secret_key=SK"
    )
    assert (s.bucket, s.prefix, s.endpoint_url, s.region) == (
        "bucket", "some/prefix/", "http://127.0.0.1:8333", "eu-west-1",
    )  # fmt: skip
    assert S3Store.from_url("s3://b").prefix == ""
    with pytest.raises(ValueError):
        S3Store.from_url("s3:///nobucket")


async def test_s3_unreachable_endpoint_is_store_error() -> None:
    from tests.fixtures.s3 import free_ports

    (port,) = free_ports(1)  # nothing listens here
    s = S3Store("b", endpoint_url=f"http://127.0.0.1:{port}", region="us-east-1",
                access_key="a", secret_key="b")  # fmt: skip
    try:
        with pytest.raises(StoreError):
            await s.head("k")
    finally:
        await s.close()
