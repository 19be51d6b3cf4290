"""The embedded store's snapshots: taken off the write lock (the log rotated under it,
the copy of the map written beside later writes), and nothing lost wherever one stops.

A crash is the directory as it is at that point: the test holds the snapshot there (a
gate in its thread) and copies the directory, which is what a process killed at that
point leaves (every file the store wrote was fsync'd). The copy is then opened as a
new store. ``tests/integration/broker/meta/test_embedded_crashes.py`` kills a real
writer process at the same points."""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.meta.durable import LOG, PREV_LOG, SNAPSHOT, MetaDir
from broker.meta.embedded import EmbeddedStore


class Gate:
    """Holds every call of a ``MetaDir`` method after the first ``skip`` until opened:
    ``entered`` is set once a call waits."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str, skip: int) -> None:
        self.entered, self.opened = threading.Event(), threading.Event()
        real = getattr(MetaDir, name)
        calls = iter(range(1 << 30))

        def held(md: MetaDir, *args: Any) -> Any:
            if next(calls) < skip:
                return real(md, *args)
            self.entered.set()
            assert self.opened.wait(60), "the test never opened the gate"
            return real(md, *args)

        monkeypatch.setattr(MetaDir, name, held)

    async def reached(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, 60)


@pytest.fixture
def gates(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Gate]]:
    made: list[Gate] = []

    def make(name: str, skip: int = 0) -> Gate:
        made.append(Gate(monkeypatch, name, skip))
        return made[-1]

    yield make
    for g in made:  # a failing test leaves no thread waiting
        g.opened.set()


async def _contents(path: Path) -> dict[str, tuple[bytes, int, int]]:
    store = EmbeddedStore(str(path))
    try:
        assert not (path / PREV_LOG).exists()  # an interrupted snapshot finished at open
        return {kv.key: (kv.value, kv.mod_revision, kv.version) for kv in await store.range("")}
    finally:
        await store.close()


async def _fill(store: EmbeddedStore, n: int, tag: str) -> None:
    for i in range(n):
        await store.put(f"/k/{i % 40:02d}", f"{tag}{i}".encode())


async def test_writes_go_on_while_a_snapshot_is_written(
    tmp_path: Path, gates: Callable[..., Gate]
) -> None:
    """The write that makes a snapshot due is answered; the snapshot's writing then
    waits at its gate, and later writes and reads are served meanwhile (before, they
    waited for the encoding and the fsyncs). A read-only reader sees every write from
    the old snapshot and both logs. Once the snapshot is written the rotated log is
    gone and a reopened store has everything."""
    gate = gates("write_snapshot")
    store = EmbeddedStore(str(tmp_path), compact_bytes=2048)
    try:
        rev = await store.put("/big", b"x" * 4096)
        await gate.reached()
        assert (tmp_path / PREV_LOG).exists()
        for i in range(20):  # each would have waited for the snapshot before
            assert await asyncio.wait_for(store.put(f"/after/{i}", b"v"), 30) == rev + 1 + i
        reader = EmbeddedStore(str(tmp_path), read_only=True)
        try:
            assert reader.revision == rev + 20
            assert len(await reader.range("/after/")) == 20
        finally:
            await reader.close()
        expected = {kv.key: kv for kv in await store.range("")}
        gate.opened.set()
        await store.compact()  # waits for the snapshot under way, then takes another
        assert not (tmp_path / PREV_LOG).exists()
    finally:
        gate.opened.set()
        await store.close()
    again = EmbeddedStore(str(tmp_path))
    try:
        assert {kv.key: kv for kv in await again.range("")} == expected
        assert again.revision == rev + 20
    finally:
        await again.close()


@pytest.mark.parametrize("point", ["write_snapshot", "_drop_prev"])
async def test_a_crash_inside_a_snapshot_loses_nothing(
    tmp_path: Path, gates: Callable[..., Gate], point: str
) -> None:
    """Stopped after the rotation (old snapshot + rotated log + new log) or after the new
    snapshot's rename (the rotated log still there): every answered write is in the
    store that opens the directory, with its revision and version, and it writes on."""
    gate = gates(point, skip=1)  # the first snapshot is written, the second stopped
    live = tmp_path / "live"
    store = EmbeddedStore(str(live), compact_bytes=4096)
    try:
        await _fill(store, 200, "a")  # ~65 records of the log per snapshot
        await gate.reached()
        await _fill(store, 30, "b")  # answered while the snapshot is stopped
        answered = {kv.key: (kv.value, kv.mod_revision, kv.version) for kv in await store.range("")}
        crashed = tmp_path / "crashed"
        shutil.copytree(live, crashed, ignore=shutil.ignore_patterns("LOCK"))
    finally:
        gate.opened.set()
        await store.close()
    assert (crashed / PREV_LOG).exists() and (crashed / LOG).exists()
    assert (crashed / SNAPSHOT).exists()
    assert await _contents(crashed) == answered
    again = EmbeddedStore(str(crashed))
    try:
        assert again.revision == 230
        assert await again.put("/k/00", b"next") == 231
    finally:
        await again.close()
    assert (await _contents(crashed))["/k/00"] == (b"next", 231, answered["/k/00"][2] + 1)


async def test_a_failed_snapshot_keeps_the_rotated_log_until_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snapshot's write fails (a full disk): the rotated log stays, writes go on in
    the new one, and the next snapshot (no second rotation while the first log is
    there) covers both and drops it. Reopened at each step, nothing is missing."""
    from broker.meta import wal

    real = wal.write_atomic
    failing = threading.Event()
    failing.set()

    def full_disk(path: str, data: bytes) -> None:
        if failing.is_set():
            raise OSError(28, "No space left on device")
        real(path, data)

    monkeypatch.setattr(wal, "write_atomic", full_disk)
    store = EmbeddedStore(str(tmp_path), compact_bytes=4096)
    try:
        await _fill(store, 100, "a")
        while store._compacting is not None:  # the failing snapshot has run its course
            await store._compacting
        assert (tmp_path / PREV_LOG).exists() and not (tmp_path / SNAPSHOT).exists()
        await _fill(store, 30, "b")
        answered = {kv.key: (kv.value, kv.mod_revision, kv.version) for kv in await store.range("")}
        failing.clear()
        await store.compact()
        assert not (tmp_path / PREV_LOG).exists() and (tmp_path / SNAPSHOT).exists()
    finally:
        failing.clear()
        await store.close()
    assert await _contents(tmp_path) == answered


async def test_a_snapshot_is_the_map_at_its_rotation(
    tmp_path: Path, gates: Callable[..., Gate]
) -> None:
    """Writes applied while the snapshot is written change the live map, not the copy
    the snapshot encodes: the snapshot file holds the values as they were at the
    rotation, and its revision is the rotation's."""
    from broker.meta import wal

    gate = gates("write_snapshot")
    store = EmbeddedStore(str(tmp_path), compact_bytes=1024)
    try:
        rev = await store.put("/k", b"x" * 2048)
        await gate.reached()
        await store.put("/k", b"changed")  # replaces the entry the copy holds
        await store.delete("/gone-before-the-copy-was-made")
        gate.opened.set()
        while store._compacting is not None:
            await store._compacting
    finally:
        gate.opened.set()
        await store.close()
    snap_rev, entries = wal.decode_snapshot((tmp_path / SNAPSHOT).read_bytes())
    assert snap_rev == rev
    assert [(e.key, e.value, e.mod_revision, e.version) for e in entries] == [
        ("/kafscale/k", b"x" * 2048, rev, 1)
    ]


async def test_a_reader_starts_again_when_the_log_rotates_under_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only reader finds no rotated log, then the writer rotates before the
    reader reads ``LOG``: the new ``LOG`` it would read is empty and the old snapshot
    unchanged, so only the change of file tells it that records moved out of its sight.
    It starts again and sees every write."""
    from broker.meta import durable, wal

    writer = EmbeddedStore(str(tmp_path), compact_bytes=1 << 30)
    try:
        for i in range(10):
            await writer.put(f"/k/{i}", b"v")
        real = wal.read_file
        rotated: list[bool] = []

        def read_file(path: str) -> Any:
            found = real(path)
            if path.endswith(PREV_LOG) and not rotated:
                rotated.append(writer._files.rotate())  # no write is under way
            return found

        monkeypatch.setattr(durable.wal, "read_file", read_file)
        reader = EmbeddedStore(str(tmp_path), read_only=True)
        try:
            assert rotated == [True]
            assert reader.revision == 10
            assert len(await reader.range("/k/")) == 10
        finally:
            await reader.close()
    finally:
        await writer.close()
