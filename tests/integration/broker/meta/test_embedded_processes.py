"""The embedded store beside a writer in another process: the directory lock and a
read-only reader."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from broker.meta.base import MetaStoreError, open_meta
from broker.meta.embedded import EmbeddedStore

pytestmark = pytest.mark.integration


_WRITER = """
import asyncio, sys
from broker.meta.embedded import EmbeddedStore
async def main():
    store = EmbeddedStore(sys.argv[1])
    for i in range(10):
        await store.put(f"/topics/t{i}", b"cfg")
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await store.close()
asyncio.run(main())
"""


async def test_read_only_reader_beside_a_writer_process(tmp_path: Path) -> None:
    path = str(tmp_path / "meta")
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=str(Path(__file__).resolve().parents[4]),
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
        assert line.strip() == b"ready"
        with pytest.raises(MetaStoreError, match="in use"):
            EmbeddedStore(path)
        reader = open_meta(f"embedded://{path}", read_only=True)
        try:
            assert [kv.key for kv in await reader.range("/topics/")] == [
                f"/topics/t{i}" for i in range(10)
            ]
        finally:
            await reader.close()
        proc.stdin.write(b"\n")
        proc.stdin.flush()
        assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()
