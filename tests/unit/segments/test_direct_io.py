"""segments/direct_io.py: objects written with O_DIRECT hold exactly their bytes."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import crc32c
import pytest

from segments import direct_io, local_store
from segments.direct_io import ALIGN, write_direct
from segments.local_store import DIRECT_MIN_BYTES, PACED_PIECE_BYTES, LocalStore, crc_etag
from segments.store import Buffer


@pytest.mark.parametrize("size", [1, ALIGN - 1, ALIGN, ALIGN + 1, 3 * (1 << 20) + 17])
def test_sizes_round_trip(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    k = min(7, size)
    m = max(k, size // 2)
    parts: list[bytes | bytearray | memoryview] = [
        data[:k],
        memoryview(data)[k:m],
        bytearray(data[m:]),
    ]
    got = write_direct(str(tmp_path / "obj"), parts)
    if got is None:
        pytest.skip("this filesystem does not take O_DIRECT")
    assert got == (crc32c.crc32c(data), size)
    assert (tmp_path / "obj").read_bytes() == data  # the padding is cut off


def test_exclusive(tmp_path: Path) -> None:
    (tmp_path / "obj").write_bytes(b"there")
    with pytest.raises(FileExistsError):
        write_direct(str(tmp_path / "obj"), [b"x" * 5000])
    assert (tmp_path / "obj").read_bytes() == b"there"


@pytest.mark.parametrize("direct_io", [True, False])
async def test_store_writes_the_same_either_way(tmp_path: Path, direct_io: bool) -> None:
    store = LocalStore(str(tmp_path), direct_io=direct_io)
    data = os.urandom(100_000)
    etag = await store.put_if_absent("t/0/seg", [data[:10], data[10:]])
    assert etag == crc_etag(crc32c.crc32c(data), len(data))
    assert await store.get("t/0/seg", if_match=etag) == data
    assert [p.name for p in (tmp_path / "t" / "0").iterdir()] == ["seg"]  # no temp file left


def test_the_switch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert LocalStore.from_url(f"file://{tmp_path}").direct_io is False  # the default
    monkeypatch.setenv("KAFSCALE_DIRECT_IO", "1")
    assert LocalStore.from_url(f"file://{tmp_path}").direct_io is True


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the objects the store writes through ``write_direct`` (the real one)."""
    sizes: list[int] = []
    real = local_store.write_direct

    def spy(path: str, data: Sequence[Buffer], *args: Any) -> tuple[int, int] | None:
        sizes.append(sum(memoryview(b).nbytes for b in data))
        return real(path, data, *args)

    monkeypatch.setattr(local_store, "write_direct", spy)
    return sizes


async def test_large_flush_puts_go_direct_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = _spy(monkeypatch)
    store = LocalStore.from_url(f"file://{tmp_path}/s")
    big, small = os.urandom(DIRECT_MIN_BYTES + 5), os.urandom(DIRECT_MIN_BYTES - 1)
    await store.put_if_absent("t/0/big", [big[:7], big[7:]])
    await store.put_if_absent("t/0/small", [small])
    await store.put_paced_if_absent("t/0/merged", [big])  # a merge's: through the cache
    assert sizes == [len(big)]
    for key, data in (("big", big), ("small", small), ("merged", big)):
        assert await store.get(f"t/0/{key}") == data
    assert sorted(p.name for p in (tmp_path / "s/t/0").iterdir()) == ["big", "merged", "small"]


async def test_keeping_the_page_cache_writes_every_put_through_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = _spy(monkeypatch)
    store = LocalStore.from_url(f"file://{tmp_path}?keep_page_cache=true")
    await store.put_if_absent("t/0/big", [os.urandom(DIRECT_MIN_BYTES)])
    assert sizes == []


async def test_direct_io_writes_every_object_direct_merges_in_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = _spy(monkeypatch)
    writes: list[int] = []
    real_write = os.write

    def counting_write(fd: int, data: Buffer) -> int:
        writes.append(memoryview(data).nbytes)
        return real_write(fd, data)

    store = LocalStore.from_url(f"file://{tmp_path}?direct_io=true")
    data = os.urandom(3 * PACED_PIECE_BYTES + 100)
    monkeypatch.setattr(direct_io.os, "write", counting_write)
    await store.put_paced_if_absent("t/0/merged", [data])
    monkeypatch.setattr(direct_io.os, "write", real_write)
    await store.put_if_absent("t/0/small", [b"x" * 10])
    assert sizes == [len(data), 10]
    if writes:  # empty: the file system took no O_DIRECT, the page cache wrote it
        assert writes == [PACED_PIECE_BYTES] * 3 + [ALIGN]
    assert await store.get("t/0/merged") == data


@pytest.mark.parametrize("native", [True, False])
def test_the_aligned_buffer_is_filled_with_every_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    if native and direct_io._localio is None:
        pytest.skip("segments._localio is not built (pip install -e . builds it)")
    if not native:
        monkeypatch.setattr(direct_io, "_localio", None)
    data = os.urandom(3 * (1 << 20) + 17)
    mid = 3 << 19  # parts that end inside a 1 MiB chunk and span chunks
    parts: list[Buffer] = [data[:5], memoryview(data)[5:mid], bytearray(data[mid:])]
    got = write_direct(str(tmp_path / "obj"), parts, None, 1 << 20)
    if got is None:
        pytest.skip("this filesystem does not take O_DIRECT")
    assert got == (crc32c.crc32c(data), len(data))
    assert (tmp_path / "obj").read_bytes() == data


def test_copy_into_copies_the_buffers_one_after_the_other() -> None:
    if direct_io._localio is None:
        pytest.skip("segments._localio is not built (pip install -e . builds it)")
    copy_into = direct_io._localio.copy_into
    target = bytearray(b"-" * 12)
    assert copy_into(target, [b"abc", memoryview(b"defg")[1:], bytearray(b"")]) == 6
    assert target == b"abcefg------"
    with pytest.raises(ValueError, match="smaller"):
        copy_into(bytearray(2), [b"abc"])
    with pytest.raises(BufferError):
        copy_into(b"read-only", [b"a"])
    with pytest.raises(TypeError):
        copy_into(bytearray(4), [b"a", 7])


def test_pieces_cover_the_concatenation_in_steps() -> None:
    data = os.urandom(10_000)
    cuts = [0, 1, 7, 4096, 4097, 8191, 9999, 10_000]
    parts: list[Buffer] = [data[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]
    pieces = list(direct_io._pieces(parts, 4096))
    assert [n for _, n in pieces] == [4096, 4096, 10_000 - 8192]
    assert b"".join(b"".join(p) for p, _ in pieces) == data
    assert all(sum(m.nbytes for m in p) == n for p, n in pieces)
