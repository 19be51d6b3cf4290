"""``kafscale broker`` that cannot start exits 1 with one log line and no traceback.

On a port another process listens on, it exits before it has written anything to the
metadata store (a registered broker would be handed partitions by the others until its
lease ran out): broker/server.py binds its listeners first and listens on them last."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from broker.meta.base import Get, open_meta
from tests.fixtures.broker import REPO, free_port

pytestmark = pytest.mark.integration


async def _keys(etcd_url: str, prefix: str) -> list[str]:
    meta = open_meta(etcd_url, prefix=prefix)
    try:
        res = await meta.txn([], [Get("", True)])
        return [kv.key for kv in res.gets[0]]
    finally:
        await meta.close()


def _start(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)


def _one_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "cannot start broker" in errors[0], proc.stderr
    return errors[0]


def test_a_taken_port_exits_before_registering(etcd_url: str, tmp_path: Path) -> None:
    port = free_port()
    prefix = f"/taken-{uuid.uuid4().hex[:8]}"
    cmd = [
        sys.executable, "-m", "broker.cli", "broker", "--workers", "1",
        "--listen", f"127.0.0.1:{port}", "--node-id", "7",
        "--meta", etcd_url, "--meta-prefix", prefix,
        "--store", f"file://{tmp_path}/objects",
    ]  # fmt: skip
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", port))
        blocker.listen()
        proc = _start(cmd)
    assert "address already in use" in _one_error(proc)
    assert asyncio.run(_keys(etcd_url, prefix)) == []  # no cluster id, no registration


def test_an_unreachable_metadata_store_is_one_line(tmp_path: Path) -> None:
    nobody = free_port()  # nothing listens there
    cmd = [
        sys.executable, "-m", "broker.cli", "broker", "--workers", "1",
        "--listen", f"127.0.0.1:{free_port()}", "--meta", f"etcd://127.0.0.1:{nobody}",
        "--store", f"file://{tmp_path}/objects",
    ]  # fmt: skip
    assert "etcd unavailable" in _one_error(_start(cmd))
