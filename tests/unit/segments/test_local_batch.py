"""``LocalStore.put_many_if_absent`` (segments/local_batch.py): a batch of objects made
durable by two file-system barriers, each object as ``put_if_absent`` would write it;
a failed barrier fails every object of the batch and leaves no temp file; small batches
and ``syncfs=false`` take single puts."""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable
from pathlib import Path

import crc32c as crc_pkg
import pytest

from segments import local_batch
from segments.local_files import ETAG_XATTR
from segments.local_store import TMP_MARKER, LocalStore, crc_etag
from segments.store import ObjectExistsError, PutItem, StoreError


@pytest.fixture(params=["native", "python"])
def impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The batch's phases in segments/_localio.c (GIL released), or in Python (a build
    without the extension)."""
    if request.param == "native" and local_batch._localio is None:
        pytest.skip("segments._localio is not built (pip install -e . builds it)")
    if request.param == "python":
        monkeypatch.setattr(local_batch, "_localio", None)
    return str(request.param)


def _items(n: int, tag: str = "") -> list[PutItem]:
    return [PutItem(f"ns/t/{i}/seg{tag}", [os.urandom(100 + 37 * i)]) for i in range(n)]


def _temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if TMP_MARKER in p.name]


def _failing_barrier(fail_on: int) -> Callable[[int], int]:
    """A ``syncfs`` that fails (EIO) on its ``fail_on``-th call and syncs otherwise."""
    calls = [0]
    real = local_batch._SYNCFS

    def syncfs(fd: int) -> int:
        calls[0] += 1
        if calls[0] == fail_on:
            ctypes.set_errno(errno.EIO)
            return -1
        if real is not None:
            return real(fd)
        os.sync()
        return 0

    return syncfs


def test_syncfs_with_error_reports_is_used_where_the_kernel_has_it() -> None:
    release = os.uname().release.split(".")
    if not os.uname().sysname == "Linux" or (int(release[0]), int(release[1])) < (5, 8):
        pytest.skip("syncfs reports writeback errors only on Linux 5.8 and later")
    assert local_batch._SYNCFS is not None


@pytest.mark.parametrize("barrier", ["syncfs", "fsync-by-url", "fsync-no-syncfs"])
async def test_batch_writes_every_object_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, barrier: str, impl: str
) -> None:
    calls = [0]
    real = local_batch._SYNCFS

    def counted(fd: int) -> int:
        calls[0] += 1
        if real is not None:
            return real(fd)
        os.sync()
        return 0

    # fsync-no-syncfs: a kernel without syncfs (or before 5.8): an fsync per file and dir
    monkeypatch.setattr(local_batch, "_SYNCFS", None if barrier == "fsync-no-syncfs" else counted)
    monkeypatch.setattr(local_batch, "GROUP", 5)  # 12 objects: three barrier pairs
    url = f"file://{tmp_path}/objects" + ("?syncfs=false" if barrier == "fsync-by-url" else "")
    store = LocalStore.from_url(url)
    items = _items(12)
    results = await store.put_many_if_absent(items)
    for item, res in zip(items, results, strict=True):
        whole = b"".join(bytes(b) for b in item.data)
        assert res == crc_etag(crc_pkg.crc32c(whole), len(whole))
        assert await store.get(item.key, if_match=res) == whole
        path = tmp_path / "objects" / item.key
        st = path.stat()  # the ETag recorded on the file, as a single put records it
        recorded = os.getxattr(path, ETAG_XATTR).decode()
        assert recorded == f"{res} {st.st_mtime_ns} {st.st_size}"
    assert calls[0] == (6 if barrier == "syncfs" else 0)  # two per group
    assert _temp_files(tmp_path) == []
    again = await store.put_many_if_absent([items[0], items[9], *_items(8, "-new")])
    assert [type(r) for r in again[:2]] == [ObjectExistsError] * 2
    assert all(isinstance(r, str) for r in again[2:])
    assert _temp_files(tmp_path) == []  # the temp files of the refused two are gone too


@pytest.mark.parametrize("fail_on", [1, 2], ids=["data-barrier", "name-barrier"])
async def test_a_failed_barrier_fails_every_object(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_on: int, impl: str
) -> None:
    monkeypatch.setattr(local_batch, "_SYNCFS", _failing_barrier(fail_on))
    store = LocalStore(str(tmp_path / "objects"))
    items = _items(9)
    results = await store.put_many_if_absent(items)
    assert all(isinstance(r, StoreError) and "syncfs" in str(r) for r in results), results
    assert _temp_files(tmp_path) == []
    if fail_on == 1:  # the bytes were never durable: no name points at them
        assert [await store.head(i.key) for i in items] == [None] * len(items)
    # the store works on: the caller's retry under new names succeeds
    retry = await store.put_many_if_absent(_items(9, "-retry"))
    assert all(isinstance(r, str) for r in retry)


async def test_a_small_batch_takes_single_puts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_batch, "_SYNCFS", _failing_barrier(1))  # never called here
    store = LocalStore(str(tmp_path / "objects"))
    items = _items(local_batch.BATCH_MIN - 1)
    results = await store.put_many_if_absent(items, 4)
    assert all(isinstance(r, str) for r in results)
    assert [await store.get(i.key) for i in items] == [bytes(i.data[0]) for i in items]
    [exists] = await store.put_many_if_absent([items[0]])
    assert isinstance(exists, ObjectExistsError)


async def test_a_directory_removed_under_the_store_fails_one_batch_only(
    tmp_path: Path, impl: str
) -> None:
    """The native path remembers the directories it made; one removed behind the store's
    back fails its object once (a retriable error), and the next batch makes it again."""
    store = LocalStore(str(tmp_path / "objects"))
    assert all(isinstance(r, str) for r in await store.put_many_if_absent(_items(9)))
    gone = tmp_path / "objects" / "ns" / "t" / "4"
    for f in gone.iterdir():
        f.unlink()
    gone.rmdir()
    first = await store.put_many_if_absent(_items(9, "-b"))
    if impl == "native":
        assert isinstance(first[4], StoreError) and not isinstance(first[4], ObjectExistsError)
    assert all(isinstance(r, str) for i, r in enumerate(first) if i != 4)
    again = await store.put_many_if_absent(_items(9, "-c"))
    assert all(isinstance(r, str) for r in again)
    assert _temp_files(tmp_path) == []


@pytest.mark.parametrize("stall_on", [1, 2], ids=["data-barrier", "name-barrier"])
async def test_an_awaiter_cancelled_mid_barrier_leaves_no_file_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stall_on: int, impl: str
) -> None:
    """Cancelled while a thread is inside a barrier: the batch's temp files are closed
    and removed once, after that thread's step (the native path closes them in the step
    that links; a close from the cancelled awaiter waits for it), and no name points
    at bytes that were never made durable."""
    import asyncio
    import threading

    inside, go_on = threading.Event(), threading.Event()
    calls = [0]
    real = local_batch._SYNCFS

    def stalling(fd: int) -> int:
        calls[0] += 1
        if calls[0] == stall_on:
            inside.set()
            go_on.wait(60)
        if real is not None:
            return real(fd)
        os.sync()
        return 0

    monkeypatch.setattr(local_batch, "_SYNCFS", stalling)
    store = LocalStore(str(tmp_path / "objects"))
    fds = len(os.listdir("/proc/self/fd"))
    items = _items(9)
    task = asyncio.ensure_future(store.put_many_if_absent(items))
    assert await asyncio.to_thread(inside.wait, 60)
    task.cancel()
    await asyncio.sleep(0)  # the cancellation reaches the batch while the thread waits
    go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _temp_files(tmp_path) == []
    assert len(os.listdir("/proc/self/fd")) == fds
    if stall_on == 1:  # cancelled before any link: no name at all
        assert [await store.head(i.key) for i in items] == [None] * len(items)
    retry = await store.put_many_if_absent(_items(9, "-retry"))
    assert all(isinstance(r, str) for r in retry)
