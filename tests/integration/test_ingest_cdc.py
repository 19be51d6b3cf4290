"""Upserts from a Debezium-shaped change stream (``--cdc debezium --upsert-key id``).

Creates, updates and deletes (each delete followed by Debezium's tombstone) over two
partitions, into an hour-partitioned table (a key's row moves between table partitions);
after every run the table equals the final state per key of everything ingested so far:
across several runs, across a run SIGKILLed mid-commit at a deterministic fault point
(deletes and files staged, catalog not swapped), and after ``maintain --compact``.
docs/ingest.md, "Upserts and change streams".
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from broker.meta.base import open_meta
from ingest_job import catalog as cat
from ingest_job.job import IngestConfig, run_ingest
from segments.store import open_store
from tests.unit.ingest_job.conftest import KafsEnv
from tests.unit.ingest_job.segdata import PartitionWriter

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
TOPIC = "inventory.items"
TABLE = "inventory_items"


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    from ingest_job.spark import get_spark

    session = get_spark("local[2]")
    yield session
    session.stop()


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[KafsEnv]:
    data = tmp_path / "data"
    data.mkdir()
    store = open_store(f"file://{data}/segments")
    meta = open_meta("embedded", data_dir=str(data))
    try:
        yield KafsEnv(data, f"file://{data}/segments", store, meta)
    finally:
        await meta.close()
        await store.close()


class Source:
    """Debezium events for ids of one partition, and the state they lead to."""

    def __init__(self, ids: range, seed: int) -> None:
        self.ids = ids
        self.rng = random.Random(seed)
        self.state: dict[int, dict[str, Any]] = {}
        self.version = 0

    def events(self, n: int) -> list[bytes | None]:
        out: list[bytes | None] = []
        while len(out) < n:
            key = self.rng.choice(self.ids)
            self.version += 1
            row = {"id": key, "name": f"item{key}-v{self.version}", "qty": self.version}
            before = self.state.get(key)
            if before is None:
                event = {"op": self.rng.choice("cr"), "before": None, "after": row}
                self.state[key] = row
            elif self.rng.random() < 0.3:
                event = {"op": "d", "before": before, "after": None}
                del self.state[key]
            else:
                event = {"op": "u", "before": before, "after": row}
                self.state[key] = row
            payload = {**event, "source": {"db": "shop"}, "ts_ms": 1}
            # JsonConverter with schemas.enable=true wraps the event in schema + payload
            doc = {"schema": {"type": "struct"}, "payload": payload} if key % 2 else payload
            out.append(json.dumps(doc).encode())
            if event["op"] == "d":
                out.append(None)  # Debezium's tombstone for log compaction
        return out


def _quiet(_line: str) -> None:
    pass


def _cfg(env: KafsEnv) -> IngestConfig:
    return IngestConfig(
        topics=(TOPIC,), store_url=env.store_url, data_dir=str(env.data_dir), master="local[2]",
        value_format="json", cdc="debezium", upsert_key=("id",), partition_by="hour",
    )  # fmt: skip


def _table(env: KafsEnv) -> dict[int, dict[str, Any]]:
    catalog = cat.open_catalog(None, str(env.data_dir))
    rows = catalog.load_table(("kafscale", TABLE)).scan().to_arrow().to_pylist()
    out = {r["id"]: {"id": r["id"], "name": r["name"], "qty": r["qty"]} for r in rows}
    assert len(out) == len(rows), "a key is in the table twice"
    return out


def _want(sources: list[Source]) -> dict[int, dict[str, Any]]:
    return {k: v for s in sources for k, v in s.state.items()}


async def _append(writers: list[PartitionWriter], sources: list[Source], n: int) -> None:
    for w, s in zip(writers, sources, strict=True):
        await w.append(s.events(n), batch_size=7, hour_step_ms=360_000)  # 10 offsets/hour


async def test_debezium_final_state_across_runs_kill_and_compaction(
    spark: SparkSession, env: KafsEnv
) -> None:
    writers = await env.topic(TOPIC, 2)
    sources = [Source(range(0, 12), 1), Source(range(100, 112), 2)]
    await _append(writers, sources, 40)
    s1 = await asyncio.to_thread(run_ingest, _cfg(env), spark, _quiet)
    assert s1.dead_letters == 0
    assert _table(env) == _want(sources)
    await _append(writers, sources, 40)
    await asyncio.to_thread(run_ingest, _cfg(env), spark, _quiet)
    assert _table(env) == _want(sources)
    after_two = _want(sources)
    # a run killed inside its commit (deletes and files staged, catalog not swapped)
    await _append(writers, sources, 30)
    flags = ["--topics", TOPIC, "--store", env.store_url, "--data-dir", str(env.data_dir),
             "--value-format", "json", "--cdc", "debezium", "--upsert-key", "id",
             "--partition-by", "hour", "--master", "local[2]"]  # fmt: skip
    tmp = env.data_dir.parent / "tmp"  # the JVM's scratch files (a kill leaves them)
    tmp.mkdir(exist_ok=True)
    penv = dict(os.environ, PYTHONPATH=str(ROOT), PYSPARK_PYTHON=sys.executable, TMPDIR=str(tmp),
                KAFSCALE_INGEST_KILL_AT="commit.before_swap")  # fmt: skip
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "ingest_job", *flags], cwd=env.data_dir, env=penv,
        capture_output=True, text=True, timeout=300, start_new_session=True,
    )  # fmt: skip
    assert proc.returncode == -9, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "fault point commit.before_swap" in proc.stderr
    assert _table(env) == after_two  # nothing of the killed run is visible
    await asyncio.to_thread(run_ingest, _cfg(env), spark, _quiet)
    assert _table(env) == _want(sources)
    # a bad event is a dead letter, not a lost or half-applied change
    await writers[0].append([b'{"op": "x", "after": {"id": 1}}', b"[1]"])
    s4 = await asyncio.to_thread(run_ingest, _cfg(env), spark, _quiet)
    assert s4.dead_letters == 2 and _table(env) == _want(sources)
    from ingest_job.cli import main

    assert main(["maintain", "--data-dir", str(env.data_dir), "--compact"]) == 0
    assert _table(env) == _want(sources)
