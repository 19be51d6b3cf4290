#!/usr/bin/env python3
"""Start a local Kafscale cluster: one etcd and N brokers sharing one object store.

    python deploy/local_cluster.py --brokers 3            # ports 9092, 9093, 9094
    python deploy/local_cluster.py --brokers 2 --store 's3://bucket/prefix?endpoint=...'

Everything lives under ``--dir`` (default ``./cluster-data``): etcd's data, each broker's
log, and the shared directory store unless ``--store`` names another. The launcher prints
one ``ready:`` line with the bootstrap servers once every broker listens, then waits.
A broker that exits (``kill -9`` one to watch a takeover) is reported and the others
keep serving; the launcher stops by itself only once every broker has exited.
Ctrl-C or SIGTERM stops the brokers (SIGTERM: each flushes and releases its partitions),
then etcd, each by its process id. Needs ``etcd`` on PATH (Debian's ``etcd-server``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

START_TIMEOUT = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(check: object, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:  # start-up only: poll the new process's socket
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            if check():  # type: ignore[operator]
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not start within {START_TIMEOUT}s")


def _etcd_healthy(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=0.5) as r:
        return b'"true"' in r.read()


def _listening(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True


def start_etcd(root: Path, port: int) -> subprocess.Popen[bytes]:
    exe = shutil.which("etcd")
    if exe is None:
        raise SystemExit("etcd not found on PATH (apt-get install etcd-server)")
    peer = _free_port()
    urls = f"http://127.0.0.1:{port}"
    with open(root / "etcd.log", "ab") as out:
        proc = subprocess.Popen(
            [
                exe, "--name=local", f"--data-dir={root / 'etcd'}",
                f"--listen-client-urls={urls}", f"--advertise-client-urls={urls}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=local=http://127.0.0.1:{peer}",
                "--heartbeat-interval=50", "--election-timeout=500",
            ],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    _wait(lambda: _etcd_healthy(port), proc, "etcd")
    return proc


def start_broker(
    root: Path, node_id: int, port: int, store: str, meta: str, extra: list[str]
) -> subprocess.Popen[bytes]:
    workdir = root / f"broker-{node_id}"
    workdir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
    cmd = [
        sys.executable, "-m", "broker.cli", "broker", "--listen", f"127.0.0.1:{port}",
        "--node-id", str(node_id), "--workers", "1", "--store", store, "--meta", meta, *extra,
    ]  # fmt: skip
    with open(workdir / "broker.log", "ab") as out:
        proc = subprocess.Popen(
            cmd, cwd=workdir, stdout=out, stderr=subprocess.STDOUT, env=env,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    _wait(lambda: _listening(port), proc, f"broker {node_id}")
    return proc


def stop(proc: subprocess.Popen[bytes] | subprocess.Popen[str], timeout: float) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds (the launcher's, and the tests')."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _watch(procs: list[subprocess.Popen[bytes]], done: threading.Event, ttl: int) -> int:
    """Wait for Ctrl-C or SIGTERM (0). A broker that exits (``kill -9`` is the way to try
    a takeover) is reported once and the others keep serving: its partitions move to
    them when its lease expires. Only when every broker has exited does the launcher stop
    (1)."""
    reported: set[int] = set()
    while not done.wait(0.5):  # wake twice a second to notice a broker that died
        for i, proc in enumerate(procs):
            if i not in reported and proc.poll() is not None:
                reported.add(i)
                print(
                    f"broker {i} (pid {proc.pid}) exited with {proc.returncode}; the others "
                    f"take its partitions once its lease expires (--lease-ttl {ttl} s)",
                    flush=True,
                )
        if len(reported) == len(procs):
            print("every broker has exited; stopping etcd", flush=True)
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--brokers", type=int, default=3, help="number of brokers (default 3)")
    p.add_argument("--base-port", type=int, default=9092, help="first broker port (9092)")
    p.add_argument("--etcd-port", type=int, default=0, help="etcd client port (default: free)")
    p.add_argument("--dir", default="./cluster-data", help="where data and logs go")
    p.add_argument("--store", default="", help="object store URL (default: DIR/store)")
    p.add_argument("--lease-ttl", type=int, default=5, help="broker lease TTL in seconds")
    p.add_argument("broker_args", nargs="*", help="extra flags for every broker (after --)")
    args = p.parse_args(argv)
    root = Path(args.dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    repo = Path(__file__).resolve().parents[1]
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(repo), os.environ.get("PYTHONPATH", "")])
    )
    store = args.store or f"file://{root / 'store'}"
    etcd_port = args.etcd_port or _free_port()
    procs: list[subprocess.Popen[bytes]] = []
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    try:
        etcd = start_etcd(root, etcd_port)
        meta = f"etcd://127.0.0.1:{etcd_port}"
        extra = ["--lease-ttl", str(args.lease_ttl), *args.broker_args]
        for i in range(args.brokers):
            procs.append(start_broker(root, i, args.base_port + i, store, meta, extra))
        bootstrap = ",".join(f"127.0.0.1:{args.base_port + i}" for i in range(args.brokers))
        print(f"ready: bootstrap {bootstrap} meta {meta} store {store}", flush=True)
        print(f"pids: etcd {etcd.pid} brokers {' '.join(str(x.pid) for x in procs)}", flush=True)
        return _watch(procs, done, args.lease_ttl)
    except RuntimeError as exc:
        print(f"error: {exc} (logs under {root})", file=sys.stderr)
        return 1
    finally:
        for proc in reversed(procs):
            stop(proc, 30)
        if "etcd" in locals():
            stop(etcd, 10)
        print("stopped", flush=True)


if __name__ == "__main__":
    sys.exit(main())
