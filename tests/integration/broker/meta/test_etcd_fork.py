"""A process whose etcd client is busy starts other programs (fork + exec), as the
ingest job starts Spark's JVM: every child starts, and gRPC's fork handlers stay out of
it (broker/meta/__init__.py). Run in a fresh interpreter, so that this test sees what a
process importing ``broker.meta`` first gets, whatever the test session imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[4]

SCRIPT = """
import asyncio, subprocess, sys, threading
import broker.meta
from broker.meta.etcd import EtcdStore

url, forks = sys.argv[1], int(sys.argv[2])
started, stop = threading.Event(), threading.Event()

def busy() -> None:
    async def run() -> None:
        store = EtcdStore.from_url(url, prefix="/fork-test")
        try:
            while not stop.is_set():
                await store.put("/k", b"v")
                started.set()
        finally:
            await store.close()
    asyncio.run(run())

thread = threading.Thread(target=busy)
thread.start()
assert started.wait(30), "the etcd client never wrote"
failed = 0
for _ in range(forks):  # preexec_fn: fork + exec, as pyspark launches its JVM
    failed += subprocess.run(["/bin/true"], preexec_fn=lambda: None).returncode != 0
stop.set()
thread.join()
print(f"failed children: {failed}")
"""


def test_children_start_while_the_etcd_client_is_busy(etcd_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, etcd_url, "40"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "failed children: 0" in done.stdout, done.stdout
    assert "skipping fork() handlers" not in done.stderr, done.stderr[-2000:]
