"""``kafscale ingest --continuous``: micro-batches as a long-running process.

Records appended while it runs appear in the table within two micro-batches (counted in
micro-batches, not seconds); a one-shot batch run started beside it does not make either
double-commit; SIGKILL and a restart give every record exactly once; SIGTERM stops it
cleanly. docs/ingest.md, "Continuous mode".
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.meta.base import open_meta
from ingest_job import catalog as cat
from segments.store import open_store
from tests.unit.ingest_job.conftest import KafsEnv
from tests.unit.ingest_job.segdata import Rec, rows_of, values_for

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
WAIT = 240.0  # generous: Spark start-up on a loaded 2-core machine
TOPIC = "clicks"


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


class Job:
    """A ``python -m ingest_job`` process whose output lines are collected as they come."""

    def __init__(self, env: KafsEnv, *extra: str) -> None:
        flags = ["--topics", TOPIC, "--store", env.store_url, "--data-dir", str(env.data_dir),
                 "--master", "local[2]", "--partition-by", "none", *extra]  # fmt: skip
        tmp = env.data_dir.parent / "tmp"  # the JVM's scratch files (a kill leaves them)
        tmp.mkdir(exist_ok=True)
        penv = dict(
            os.environ, PYTHONPATH=str(ROOT), PYSPARK_PYTHON=sys.executable, TMPDIR=str(tmp)
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ingest_job", *flags], cwd=env.data_dir, env=penv,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:
            for line in self.proc.stdout:
                with self.cond:
                    self.lines.append(line)
                    self.cond.notify_all()
        with self.cond:
            self.lines.append("<exit>")
            self.cond.notify_all()

    def batches(self) -> list[tuple[int, int]]:
        """(micro-batch number, rows committed) of every finished micro-batch."""
        with self.cond:
            found = [re.search(r"micro-batch (\d+): committed (\d+) rows", x) for x in self.lines]
        return [(int(m.group(1)), int(m.group(2))) for m in found if m]

    def wait_rows(self, total: int) -> int:
        """Wait until this job has committed ``total`` rows; returns the micro-batch."""
        with self.cond:
            ok = self.cond.wait_for(
                lambda: "<exit>" in self.lines or sum(r for _b, r in self.batches()) >= total, WAIT
            )
        assert ok and "<exit>" not in self.lines, "".join(self.lines)[-3000:]
        done = 0
        for batch, rows in self.batches():
            done += rows
            if done >= total:
                return batch
        raise AssertionError("unreachable")

    def last_batch(self) -> int:
        b = self.batches()
        return b[-1][0] if b else 0

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self.reader.join(30)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(WAIT)
        self.reader.join(30)
        return code


def _rows(env: KafsEnv) -> list[Rec]:
    catalog = cat.open_catalog(None, str(env.data_dir))
    return rows_of(catalog.load_table(("kafscale", TOPIC)).scan().to_arrow().to_pylist())


async def test_continuous_micro_batches_exactly_once(env: KafsEnv) -> None:
    (w,) = await env.topic(TOPIC, 1)
    want = await w.append(values_for(TOPIC, 0, 0, 30))
    job = Job(env, "--continuous", "--trigger", "1s")
    try:
        job.wait_rows(30)
        appended_after = job.last_batch()
        want += await w.append(values_for(TOPIC, 0, w.next_offset, 25))
        # committed by the first micro-batch planned after the append, at the latest the
        # second after the one in progress
        assert job.wait_rows(55) <= appended_after + 2
        # a scheduled one-shot batch run beside it: neither double-commits
        want += await w.append(values_for(TOPIC, 0, w.next_offset, 40))
        batch = Job(env)
        assert batch.proc.wait(WAIT) == 0, "".join(batch.lines)[-3000:]
        batch.reader.join(30)
        with job.cond:
            job.cond.wait_for(lambda: job.last_batch() >= appended_after + 4, WAIT)
        assert _rows(env) == want
    finally:
        job.kill()
    # killed; more records; a new continuous job resumes from the table's offsets
    want += await w.append(values_for(TOPIC, 0, w.next_offset, 20))
    job = Job(env, "--continuous", "--trigger", "1s")
    try:
        job.wait_rows(20)
        assert _rows(env) == want
        assert "freshness: newest committed record is" in "".join(job.lines)
        # the newest committed timestamp is in the snapshot: a restart reports it at once
        catalog = cat.open_catalog(None, str(env.data_dir))
        tbl = catalog.load_table(("kafscale", TOPIC))
        assert cat.table_newest_ms(tbl) == max(r.timestamp for r in want)
    finally:
        assert job.stop() == 0
