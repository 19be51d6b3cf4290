"""The ingest job as a process (``python -m ingest_job``): killed runs and concurrent runs.

Every record must end up in its table exactly once whatever point a run is killed at
(SIGKILL to the run's process group, by PID) and when two runs start together.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from broker.meta.base import open_meta
from ingest_job import catalog as cat
from segments.store import open_store
from tests.unit.ingest_job.conftest import KafsEnv
from tests.unit.ingest_job.segdata import Rec, rows_of, values_for

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT = 180


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


def _start(env: KafsEnv, topics: str, *, submit: bool = False) -> subprocess.Popen[str]:
    """``python -m ingest_job`` (or ``spark-submit ingest_job/__main__.py``) as a process."""
    flags = [
        "--topics", topics, "--store", env.store_url, "--data-dir", str(env.data_dir),
        "--progress-interval", "0.5", "--unit-bytes", "1",
    ]  # fmt: skip
    if submit:
        spark_submit = str(Path(sys.executable).parent / "spark-submit")
        cmd = [spark_submit, "--master", "local[2]", str(ROOT / "ingest_job" / "__main__.py")]
    else:
        cmd = [sys.executable, "-m", "ingest_job", "--master", "local[2]"]
    tmp = _tmpdir(env)
    tmp.mkdir(exist_ok=True)  # the run's JVM keeps its scratch files here (a kill leaves them)
    penv = dict(os.environ, PYTHONPATH=str(ROOT), PYSPARK_PYTHON=sys.executable, TMPDIR=str(tmp))
    return subprocess.Popen(
        cmd + flags, cwd=env.data_dir, env=penv, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip


def _tmpdir(env: KafsEnv) -> Path:
    return env.data_dir.parent / "tmp"


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the run and its JVM (its own process group, whose id is its PID)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)
    assert proc.stdout is not None
    proc.stdout.close()


def _run_until(proc: subprocess.Popen[str], marker: str) -> list[str]:
    """Read output until a line containing ``marker``, then kill the run."""
    assert proc.stdout is not None
    seen: list[str] = []
    for line in proc.stdout:
        seen.append(line)
        if marker in line:
            break
    _kill_group(proc)
    return seen


def _finish(proc: subprocess.Popen[str]) -> str:
    out, _ = proc.communicate(timeout=RUN_TIMEOUT)
    assert proc.returncode == 0, out[-3000:]
    return out


def _finish_all(*procs: subprocess.Popen[str]) -> list[str]:
    """``_finish`` for runs started together: every one is waited for (and killed by its
    PID if a wait fails) before any result is checked."""
    outs: list[str] = []
    try:
        for proc in procs:
            outs.append(proc.communicate(timeout=RUN_TIMEOUT)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for proc, out in zip(procs, outs, strict=True):
        assert proc.returncode == 0, out[-3000:]
    return outs


def _rows(env: KafsEnv, table: str) -> list[Rec]:
    catalog = cat.open_catalog(None, str(env.data_dir))
    return rows_of(catalog.load_table(("kafscale", table)).scan().to_arrow().to_pylist())


async def _data(env: KafsEnv, topics: Sequence[str]) -> dict[str, list[Rec]]:
    want: dict[str, list[Rec]] = {}
    for topic in topics:
        for w in await env.topic(topic, 2):
            for _ in range(3):
                recs = await w.append(values_for(topic, w.partition, w.next_offset, 40))
                want.setdefault(topic, []).extend(recs)
    return {t: sorted(r, key=lambda x: (x.partition, x.offset)) for t, r in want.items()}


async def test_killed_runs_then_rerun_exactly_once(env: KafsEnv) -> None:
    want = await _data(env, ["k1", "k2"])
    # killed while the Spark tasks run (files written, nothing committed)
    seen = _run_until(_start(env, "k1,k2"), "progress:")
    # the killed JVM's scratch directories are in the run's TMPDIR, not the machine's /tmp
    assert list(_tmpdir(env).glob("blockmgr-*")), sorted(p.name for p in _tmpdir(env).iterdir())
    assert any("progress:" in line for line in seen), "".join(seen)[-2000:]
    # killed after the first table's commit, before the second's
    seen = _run_until(_start(env, "k1,k2"), "committed ")
    assert any("to kafscale.k1" in line for line in seen), "".join(seen)[-2000:]
    assert _rows(env, "k1") == want["k1"]
    out = _finish(_start(env, "k1,k2", submit=True))  # the spark-submit entry point
    assert "kafscale.k2: next offsets k2/0->120, k2/1->120" in out
    assert _rows(env, "k1") == want["k1"] and _rows(env, "k2") == want["k2"]
    # files the killed runs left behind are orphans: maintain removes them
    from ingest_job.cli import main

    assert main(["maintain", "--data-dir", str(env.data_dir), "--remove-orphans",
                 "--orphan-age-minutes", "0"]) == 0  # fmt: skip
    catalog = cat.open_catalog(None, str(env.data_dir))
    for t in ("k1", "k2"):
        tbl = catalog.load_table(("kafscale", t))
        on_disk = {str(p) for p in Path(tbl.location()[7:], "data").rglob("*.parquet")}
        live = {p[7:] for p in tbl.inspect.files().column("file_path").to_pylist()}
        assert on_disk == live
    assert _rows(env, "k1") == want["k1"] and _rows(env, "k2") == want["k2"]


async def test_two_runs_started_together_exactly_once(env: KafsEnv) -> None:
    want = await _data(env, ["cc"])
    outs = _finish_all(_start(env, "cc"), _start(env, "cc"))
    assert _rows(env, "cc") == want["cc"]
    committed = [o for o in outs if "committed 240 rows" in o]
    assert len(committed) >= 1, outs
    # a later run has nothing left to do
    out = _finish(_start(env, "cc"))
    assert "0 records from 0 segments" in out
    assert _rows(env, "cc") == want["cc"]
