"""segments/direct_io.py: objects written with O_DIRECT hold exactly their bytes."""

from __future__ import annotations

import os
from pathlib import Path

import crc32c
import pytest

from segments.direct_io import ALIGN, write_direct
from segments.local_store import LocalStore, crc_etag


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
