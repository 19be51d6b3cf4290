"""broker.repair: ``kafscale partitions truncate`` against a real embedded metadata store
and a local object store, with an in-process broker writing the log before and reading
it after."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.meta.base import open_meta
from broker.meta.schema import ProducerSnapshot, producers_key
from broker.partition import PartitionLog
from broker.repair import RepairError, Target, main, truncate
from broker.server import Broker
from protocol.batch import read_header
from protocol.errors import ErrorCode
from protocol.records import build_batch, decode_batch
from segments.store import open_store
from tests.fixtures.inprocess import local_config

TOPIC = "t"


def _config(tmp_path: Path) -> BrokerConfig:
    return local_config(tmp_path)


@asynccontextmanager
async def running(tmp_path: Path) -> AsyncIterator[Broker]:
    b = Broker(_config(tmp_path))
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


def _append(b: Broker, lg: PartitionLog, tag: str) -> asyncio.Future[None]:
    view = memoryview(
        bytearray(build_batch([(tag.encode(), b"%s-%d" % (tag.encode(), j), []) for j in range(2)]))
    )
    res = lg.append(read_header(view), view)
    assert res.error == ErrorCode.NONE and res.done is not None
    b.logs.appended(lg, len(view))
    return res.done


async def _values(b: Broker) -> list[tuple[int, bytes]]:
    lg = await b.logs.get(TOPIC, 0)
    out = []
    for view in await b.logs.read(lg, 0, 1 << 20):
        _h, recs = decode_batch(view)
        out += [(r.offset, r.value or b"") for r in recs]
    return out


async def _write_log(tmp_path: Path) -> None:
    """Segments: [0..1], [2..5] (two batches), [6..7]."""
    async with running(tmp_path) as b:
        await b.topics.create(TOPIC, 1)
        lg = await b.logs.get(TOPIC, 0)
        await _append(b, lg, "a")
        f1, f2 = _append(b, lg, "b"), _append(b, lg, "c")
        await asyncio.gather(f1, f2)
        await _append(b, lg, "d")
        assert [s.base for s in lg.segments] == [0, 2, 6]
        with pytest.raises(RepairError, match="owned"):  # a running owner is never overridden
            await truncate(b.meta, b.store, Target("default", TOPIC, 0), 4, execute=True)


async def test_truncate_cuts_back_to_a_batch_boundary(tmp_path: Path) -> None:
    await _write_log(tmp_path)
    meta = open_meta("embedded", str(tmp_path / "data"))
    store = open_store(f"file://{tmp_path}/data")
    t = Target("default", TOPIC, 0)
    try:
        dry = await truncate(meta, store, t, 4, execute=False)
        assert dry[-1].startswith("dry run")
        with pytest.raises(RepairError, match="inside the batch"):
            await truncate(meta, store, t, 3, execute=True)
        with pytest.raises(RepairError, match="outside the log"):
            await truncate(meta, store, t, 9, execute=True)
        # a producer snapshot of the log before the cut would name batches cut off
        await meta.put(
            producers_key(TOPIC, 0), ProducerSnapshot(8, ((7, 0, ((0, 1, 6),), 0),)).encode()
        )
        done = await truncate(meta, store, t, 4, execute=True)
        assert done[-1].endswith("now ends at 4")
        assert await meta.get(f"/owners/{TOPIC}/0") is None
        assert await meta.get(producers_key(TOPIC, 0)) is None
    finally:
        await store.close()
        await meta.close()
    async with running(tmp_path) as b:
        lg = await b.logs.get(TOPIC, 0)
        assert lg.next_offset == 4 and lg.hw == 4
        assert await _values(b) == [(0, b"a-0"), (1, b"a-1"), (2, b"b-0"), (3, b"b-1")]
        await _append(b, lg, "e")
        vals = await _values(b)
        assert vals[4:] == [(4, b"e-0"), (5, b"e-1")]


def test_cli_dry_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    asyncio.run(_write_log(tmp_path))
    args = ["--store", f"file://{tmp_path}/data", "--data-dir", str(tmp_path / "data")]
    assert main(["truncate", TOPIC, "0", "--to", "6", *args]) == 0
    out = capsys.readouterr().out
    assert "drop segment 6..7" in out and "dry run" in out
    assert main(["truncate", TOPIC, "0", "--to", "99", *args]) == 1


def test_cli_one_line_when_a_store_cannot_be_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An embedded store a running broker holds, an unsupported store URL and an etcd
    that refuses connections: one line on stderr naming the cause and exit 1, never a
    traceback. The partition is untouched."""
    asyncio.run(_write_log(tmp_path))
    data = tmp_path / "data"
    args = ["--store", f"file://{data}", "--data-dir", str(data)]
    cut = ["truncate", TOPIC, "0", "--to", "6", "--execute"]
    held = open_meta("embedded", str(data), "/kafscale")  # as a running broker holds it
    try:
        assert main([*cut, *args]) == 1
    finally:
        asyncio.run(held.close())
    err = capsys.readouterr().err
    assert "MetaStoreError" in err and "in use by another process" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert main([*cut, "--store", "bogus://x", "--data-dir", str(data)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: unsupported object store URL 'bogus://x'")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    assert main([*cut, *args, "--meta", f"etcd://127.0.0.1:{closed}"]) == 1
    err = capsys.readouterr().err
    assert "MetaStoreError: etcd unavailable" in err and "Traceback" not in err
    assert main([*cut[:-1], *args]) == 0  # the dry run still plans the whole cut
    assert "drop segment 6..7" in capsys.readouterr().out
