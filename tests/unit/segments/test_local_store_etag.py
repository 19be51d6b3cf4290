"""LocalStore records each object's ETag on the file (xattr), for other processes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import crc32c
import pytest

from segments.local_files import ETAG_XATTR
from segments.local_store import LocalStore, crc_etag
from segments.store import PreconditionFailedError


async def test_another_store_reads_the_recorded_etag(tmp_path: Path) -> None:
    data = b"segment bytes" * 1000
    etag = await LocalStore(str(tmp_path)).put_if_absent("t/0/a.kfs", [data])
    assert etag == crc_etag(crc32c.crc32c(data), len(data))
    path = tmp_path / "t" / "0" / "a.kfs"
    st = os.stat(path)
    assert os.getxattr(path, ETAG_XATTR) == f"{etag} {st.st_mtime_ns} {st.st_size}".encode()
    fresh = LocalStore(str(tmp_path))  # another process: an empty in-memory cache
    assert await fresh.get("t/0/a.kfs", if_match=etag) == data
    with pytest.raises(PreconditionFailedError):
        await fresh.get("t/0/a.kfs", if_match="0" * 32)


async def test_the_attribute_is_trusted_only_while_mtime_and_size_match(tmp_path: Path) -> None:
    data = b"x" * 4096
    etag = await LocalStore(str(tmp_path)).put_if_absent("k", [data])
    path = tmp_path / "k"
    st = os.stat(path)
    # the recorded value is used as is (no hashing) while it matches the file ...
    os.setxattr(path, ETAG_XATTR, f"feedface {st.st_mtime_ns} {st.st_size}".encode())
    assert (await LocalStore(str(tmp_path)).head("k")).etag == "feedface"  # type: ignore[union-attr]
    os.setxattr(path, ETAG_XATTR, f"{etag} {st.st_mtime_ns} {st.st_size}".encode())
    # ... and an in-place rewrite (new mtime) makes it stale: the object is hashed again
    with open(path, "r+b") as f:
        f.write(b"y")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    fresh = LocalStore(str(tmp_path))
    with pytest.raises(PreconditionFailedError):
        await fresh.get("k", if_match=etag)
    new = crc_etag(crc32c.crc32c(b"y" + data[1:]), len(data))
    assert await fresh.get("k", if_match=new) == b"y" + data[1:]
    assert os.getxattr(path, ETAG_XATTR).split(b" ")[0] == new.encode()  # re-recorded


async def test_objects_without_the_attribute_are_hashed(tmp_path: Path) -> None:
    (tmp_path / "plain").write_bytes(b"written by something else")
    info = await LocalStore(str(tmp_path)).head("plain")
    assert info is not None
    data = b"written by something else"
    assert info.etag == crc_etag(crc32c.crc32c(data), len(data))


async def test_a_legacy_md5_etag_still_matches(tmp_path: Path) -> None:
    """Manifests written before the CRC ETags name objects by their MD5: an If-Match
    with it still matches the content (hashed with MD5), and only the right one does."""
    data = b"an older segment" * 100
    store = LocalStore(str(tmp_path))
    await store.put_if_absent("old", [data])  # records the CRC ETag
    legacy = hashlib.md5(data, usedforsecurity=False).hexdigest()
    assert await store.get("old", if_match=legacy) == data
    assert await LocalStore(str(tmp_path)).get("old", 0, 5, if_match=legacy) == data[:5]
    with pytest.raises(PreconditionFailedError):
        await store.get("old", if_match=hashlib.md5(b"other").hexdigest())
