"""A writer process that dies inside a snapshot loses no answered write.

The writer (a real process on the embedded store) prints each write once its ``put``
has answered, and dies with ``os._exit`` when its second snapshot reaches a chosen point
(the first is written whole, so an older snapshot is there): right after the log's
rotation, with the new snapshot's temp file written but not renamed, or after the
rename with the rotated log not yet dropped. The directory it leaves is opened by this
process: every answered write is there, at its revision."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from broker.meta.durable import PREV_LOG
from broker.meta.embedded import EmbeddedStore

pytestmark = pytest.mark.integration

_WRITER = """
import asyncio, itertools, os, sys
from broker.meta import durable, wal
from broker.meta.durable import MetaDir
from broker.meta.embedded import EmbeddedStore

path, point = sys.argv[1], sys.argv[2]
calls = itertools.count()

def dies_on_the_second(real):
    def wrapper(*args):
        if next(calls) >= 1:
            os._exit(9)
        return real(*args)
    return wrapper

if point == "rename":  # the temp file written and fsync'd, not yet renamed
    real_replace = os.replace
    def replace(src, dst):
        if dst.endswith("/snapshot") and next(calls) >= 1:
            os._exit(9)
        real_replace(src, dst)
    wal.os.replace = replace
else:
    setattr(MetaDir, point, dies_on_the_second(getattr(MetaDir, point)))

async def main():
    store = EmbeddedStore(path, compact_bytes=4096)
    for i in range(100_000):
        key, value = f"/k/{i % 40:02d}", f"v{i}".encode()
        rev = await store.put(key, value)
        sys.stdout.write(f"{key} {value.decode()} {rev}\\n")  # one write: one line
        sys.stdout.flush()
    sys.exit("the writer was never stopped")
asyncio.run(main())
"""


@pytest.mark.parametrize("point", ["write_snapshot", "rename", "_drop_prev"])
async def test_a_writer_killed_inside_a_snapshot_loses_nothing(tmp_path: Path, point: str) -> None:
    path = tmp_path / "meta"
    proc = subprocess.run(
        [sys.executable, "-c", _WRITER, str(path), point],
        capture_output=True,
        timeout=300,
        cwd=str(Path(__file__).resolve().parents[4]),
    )
    assert proc.returncode == 9, proc.stderr.decode()[-2000:]
    answered: dict[str, tuple[bytes, int]] = {}
    last = 0
    lines = proc.stdout.decode().split("\n")
    for line in lines[:-1]:  # the last is empty, or what the exit cut off (not counted)
        key, text, number = line.split()
        answered[key] = (text.encode(), int(number))
        last = int(number)
    assert last > 100  # past the first snapshot (~65 records of log each)
    assert (path / PREV_LOG).exists()  # died inside the snapshot, at every point
    store = EmbeddedStore(str(path))
    try:
        assert not (path / PREV_LOG).exists()  # the interrupted snapshot is finished
        assert store.revision >= last  # a write may land after its answer was printed
        found = {kv.key: (kv.value, kv.mod_revision) for kv in await store.range("/k/")}
        for key, (value, rev) in answered.items():
            got_value, got_rev = found[key]
            assert got_rev >= rev and (got_rev > rev or got_value == value), key
    finally:
        await store.close()
