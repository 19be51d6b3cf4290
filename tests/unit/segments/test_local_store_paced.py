"""``LocalStore.put_paced_if_absent`` and ``segments.store.put_background``: a background
writer's PUT (merges) reaches the disk in pieces, each made durable before the next is
written (docs/benchmarks.md, "Round 19"), and is otherwise the same PUT as
``put_if_absent``: the same bytes, ETag, exclusivity and temp-file cleanup."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from segments import local_files
from segments.local_store import PACED_PIECE_BYTES, LocalStore
from segments.store import ObjectExistsError, paces_puts, put_background


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of the file at each ``os.fdatasync`` while the test runs (the calls
    still go through to the kernel)."""
    seen: list[int] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        seen.append(os.fstat(fd).st_size)
        real(fd)

    monkeypatch.setattr(local_files.os, "fdatasync", fdatasync)
    return seen


def _pieces(n: int) -> list[bytes]:
    """``n`` bytes in uneven buffers (pieces do not follow the buffers' bounds)."""
    blob = os.urandom(n)
    cuts = [0, 1000, 70_000, 300_001, 300_002, n]
    return [blob[a:b] for a, b in zip(cuts, cuts[1:], strict=False) if a < b]


@pytest.mark.parametrize("size", [PACED_PIECE_BYTES * 3 + 12_345, 100, PACED_PIECE_BYTES * 2])
async def test_paced_put_writes_the_same_object_in_durable_pieces(
    tmp_path: Path, syncs: list[int], size: int
) -> None:
    store = LocalStore(str(tmp_path / "objects"))
    data = _pieces(size)
    paced = await store.put_paced_if_absent("t/0/paced", data)
    # every full piece was made durable before the next was written; the tail is
    # left to the PUT's own fsync
    assert syncs == [PACED_PIECE_BYTES * (i + 1) for i in range(size // PACED_PIECE_BYTES)]
    syncs.clear()
    plain = await store.put_if_absent("t/0/plain", data)
    assert syncs == []
    assert paced == plain  # the ETag is the content's: the same bytes
    assert await store.get("t/0/paced") == b"".join(data)
    info = await store.head("t/0/paced")
    assert info is not None and info.size == size and info.etag == paced
    # nothing but the two objects (no temp file left behind)
    assert sorted(os.listdir(tmp_path / "objects" / "t" / "0")) == ["paced", "plain"]


async def test_paced_put_is_exclusive_and_takes_the_callers_crc(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path / "objects"))
    data = [os.urandom(PACED_PIECE_BYTES + 1)]
    etag = await store.put_if_absent("k", data)
    with pytest.raises(ObjectExistsError):
        await store.put_paced_if_absent("k", [b"other"])
    assert await store.get("k") == data[0]
    # a CRC the caller already has becomes the ETag's (as put_if_absent's crc32c)
    crc = int(etag.split("-")[1], 16)
    assert await store.put_paced_if_absent("k2", data, crc32c=crc) == etag
    assert not [n for n in os.listdir(tmp_path / "objects") if n.startswith(".")]


class _Plain:
    """A store with ``put_if_absent`` only (as the S3 store): nothing to pace."""

    def __init__(self) -> None:
        self.puts: list[tuple[str, bytes, int | None]] = []

    async def put_if_absent(self, key: str, data: list[bytes], *, crc32c: int | None = None) -> str:
        self.puts.append((key, b"".join(data), crc32c))
        return "etag"


async def test_put_background_paces_where_the_store_can(tmp_path: Path, syncs: list[int]) -> None:
    store = LocalStore(str(tmp_path / "objects"))
    assert paces_puts(store)
    data = [os.urandom(PACED_PIECE_BYTES * 2 + 1)]
    await put_background(store, "a", data)
    assert syncs == [PACED_PIECE_BYTES, PACED_PIECE_BYTES * 2]
    assert await store.get("a") == data[0]
    plain = _Plain()
    assert not paces_puts(plain)
    assert await put_background(plain, "b", [b"x", b"y"], crc32c=7) == "etag"  # type: ignore[arg-type]
    assert plain.puts == [("b", b"xy", 7)]
