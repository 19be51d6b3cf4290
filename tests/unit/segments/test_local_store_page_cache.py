"""``LocalStore.put_if_absent`` drops a written object's pages from the page cache once it
is durable (``file://PATH?keep_page_cache=true``, or the deprecated
``KAFSCALE_KEEP_PAGE_CACHE=1``: keeps them); the object reads back intact. The store's
URL switches are parsed strictly."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

import pytest

from segments.local_store import LocalStore

SIZE = 4 << 20


def _resident_pages(path: str) -> int:
    """Pages of ``path`` in the page cache (mincore(2) over a shared mapping)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size = os.path.getsize(path)
    pages = -(-size // mmap.PAGESIZE)
    fd = os.open(path, os.O_RDWR)
    try:
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    try:
        view = (ctypes.c_char * size).from_buffer(mm)
        vec = (ctypes.c_ubyte * pages)()
        if libc.mincore(ctypes.addressof(view), size, vec) != 0:
            pytest.skip(f"mincore failed: errno {ctypes.get_errno()}")
        del view
        return sum(v & 1 for v in vec)
    finally:
        mm.close()


def _drops_clean_pages(tmp_path: Path) -> bool:
    """Whether this file system drops a fsynced file's pages on POSIX_FADV_DONTNEED
    (tmpfs keeps them: they are the file)."""
    probe = tmp_path / "probe"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, os.urandom(SIZE))
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return _resident_pages(str(probe)) < SIZE // mmap.PAGESIZE // 2


async def test_written_objects_leave_the_page_cache_unless_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not _drops_clean_pages(tmp_path):
        pytest.skip("this file system keeps clean pages on POSIX_FADV_DONTNEED (tmpfs?)")
    data = os.urandom(SIZE)
    dropping = LocalStore.from_url(f"file://{tmp_path}/drop")
    assert dropping.drop_cache
    await dropping.put_if_absent("t/0/seg", [data[: SIZE // 2], data[SIZE // 2 :]])
    assert _resident_pages(str(tmp_path / "drop/t/0/seg")) < SIZE // mmap.PAGESIZE // 2
    assert await dropping.get("t/0/seg") == data  # read back from the disk, intact

    keeping = LocalStore.from_url(f"file://{tmp_path}/keep?keep_page_cache=true")
    assert not keeping.drop_cache and keeping.root == str(tmp_path / "keep")
    await keeping.put_if_absent("t/0/seg", [data])
    assert _resident_pages(str(tmp_path / "keep/t/0/seg")) > SIZE // mmap.PAGESIZE // 2
    assert await keeping.get("t/0/seg") == data

    monkeypatch.setenv("KAFSCALE_KEEP_PAGE_CACHE", "1")  # the deprecated alias
    alias = LocalStore.from_url(f"file://{tmp_path}/alias")
    assert not alias.drop_cache
    await alias.put_if_absent("t/0/seg", [data])
    assert _resident_pages(str(tmp_path / "alias/t/0/seg")) > SIZE // mmap.PAGESIZE // 2


def test_url_switches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAFSCALE_KEEP_PAGE_CACHE", raising=False)
    monkeypatch.delenv("KAFSCALE_DIRECT_IO", raising=False)
    plain = LocalStore.from_url(f"file://{tmp_path}/a")
    assert plain.drop_cache and not plain.direct_io and plain.syncfs
    assert not LocalStore.from_url(f"file://{tmp_path}/a?syncfs=false").syncfs
    both = LocalStore.from_url(f"file://{tmp_path}/a?keep_page_cache=1&direct_io=true")
    assert not both.drop_cache and both.direct_io and both.root == str(tmp_path / "a")
    off = LocalStore.from_url(f"file://{tmp_path}/a?keep_page_cache=false")
    assert off.drop_cache
    monkeypatch.setenv("KAFSCALE_KEEP_PAGE_CACHE", "1")
    monkeypatch.setenv("KAFSCALE_DIRECT_IO", "1")
    assert not LocalStore.from_url(f"file://{tmp_path}/a").drop_cache  # the env aliases
    assert LocalStore.from_url(f"file://{tmp_path}/a").direct_io
    assert LocalStore.from_url(f"file://{tmp_path}/a?keep_page_cache=false").drop_cache
    assert not LocalStore.from_url(f"file://{tmp_path}/a?direct_io=false").direct_io
    with pytest.raises(ValueError, match="keep_page_cahce"):
        LocalStore.from_url(f"file://{tmp_path}/a?keep_page_cahce=true")  # a typo
    with pytest.raises(ValueError, match="want true or false"):
        LocalStore.from_url(f"file://{tmp_path}/a?keep_page_cache=maybe")
    with pytest.raises(ValueError, match="empty path"):
        LocalStore.from_url("file://?keep_page_cache=true")
