"""``kafscale broker`` on a port another process listens on: it exits 1 with one log
line, before it has written anything to the metadata store (a registered broker would be
handed partitions by the others until its lease ran out). broker/server.py binds its
listeners first and listens on them last."""

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


def test_a_taken_port_exits_before_registering(etcd_url: str, tmp_path: Path) -> None:
    port = free_port()
    prefix = f"/taken-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
    cmd = [
        sys.executable, "-m", "broker.cli", "broker", "--workers", "1",
        "--listen", f"127.0.0.1:{port}", "--node-id", "7",
        "--meta", etcd_url, "--meta-prefix", prefix,
        "--store", f"file://{tmp_path}/objects",
    ]  # fmt: skip
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", port))
        blocker.listen()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "cannot start broker" in errors[0], proc.stderr
    assert "address already in use" in errors[0]
    assert "Traceback" not in proc.stderr
    assert asyncio.run(_keys(etcd_url, prefix)) == []  # no cluster id, no registration
