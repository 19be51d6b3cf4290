"""The targets of ``bench.broker`` and what is measured of them besides the load.

A target is a bootstrap address with, for the brokers, the server process: a broker on a
local-directory store (``local``; ``noval`` without full produce validation), the same
broker on SeaweedFS (``s3``), or librdkafka's mock cluster hosted by a worker process
(``mock``). Each is a context manager that starts it and stops it by PID. ``Sampler``
samples a broker's RSS (``/proc/PID/status``) and ``/metrics`` gauges through a run,
``cpu_seconds`` its CPU time (``/proc/PID/stat``), and ``profiled`` records it with
py-spy during a phase.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

MIB = 1 << 20
TARGETS = (
    "base", "local", "shared", "noval", "etcd", "etcdshared", "etcdcycles", "workers", "s3",
    "s3shared", "s3cycles", "mock",
)  # fmt: skip
# the ``shared``, ``etcdshared`` and ``s3shared`` targets: ``local``, ``etcd`` and ``s3``
# writing a flush cycle's small segments as one shared object (docs/format.md, "Shared
# objects"); the ``*cycles`` targets: that, and committing a cycle as one cycle key
# (docs/architecture.md, "Cycle keys")
SHARED_ARGS = ["--shared-objects-min-partitions=2"]
CYCLE_ARGS = [*SHARED_ARGS, "--cycle-keys-min-partitions=2"]


@dataclass(frozen=True, slots=True)
class BrokerLimits:
    cache_bytes: int = 64 * MIB
    broker_inflight_bytes: int = 64 * MIB
    connection_inflight_bytes: int = 32 * MIB

    def args(self) -> list[str]:
        return [
            "--cache-bytes", str(self.cache_bytes),
            "--broker-inflight-bytes", str(self.broker_inflight_bytes),
            "--connection-inflight-bytes", str(self.connection_inflight_bytes),
        ]  # fmt: skip


# SeaweedFS's volume size for the benchmarks' S3 server: at the tests' 16 MB a new volume
# is grown every 4 chunks and PUTs stall on it (8 MiB PUTs, 2 in flight: 26-47 MB/s with
# 1.3-1.6 s stalls, against 45-190 MB/s at 1024 MB; docs/benchmarks.md, "Round 3: S3
# produce"). A benchmark uses one or two buckets, far from the volume count's cap.
S3_VOLUME_MB = 1024


@dataclass
class Target:
    name: str
    bootstrap: str
    pid: int | None = None  # the broker process (RSS sampling, profiling)
    metrics_url: str | None = None
    limit_bytes: int = 0  # broker in-flight + cache bytes
    flush_interval_ms: float = float("nan")  # the broker's (bench/broker_waits.py)
    store_pid: int | None = None  # the S3 server (SeaweedFS), on the same cores
    # the mock's topic creation (it answers no CreateTopics): (name, partitions)
    create_mock_topic: Callable[[str, int], None] | None = None


def flush_interval_ms(extra: list[str], s3: bool) -> float:
    """The flush interval a broker started with ``extra`` flags runs with."""
    from broker.cli_broker import LOCAL_FLUSH_INTERVAL_MS, S3_FLUSH_INTERVAL_MS

    for i, arg in enumerate(extra):
        if arg.startswith("--flush-interval-ms="):
            return float(arg.split("=", 1)[1])
        if arg == "--flush-interval-ms" and i + 1 < len(extra):
            return float(extra[i + 1])
    return float(S3_FLUSH_INTERVAL_MS if s3 else LOCAL_FLUSH_INTERVAL_MS)


@dataclass
class Sampler:
    """Samples a process's RSS (every 0.1 s) and the broker's /metrics (every 0.5 s, but
    not while ``quiet()`` holds: the paced phases measure latency, and a scrape costs the
    broker ~5-25 ms of CPU on its event loop, by the number of series; docs/benchmarks.md,
    "Round 21")."""

    pid: int
    metrics_url: str | None
    baseline_rss: int = 0
    max_rss: int = 0
    peaks: dict[str, float] = field(default_factory=dict)
    scrapes: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _quiet: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """No /metrics scrape starts while the block runs (RSS is still sampled)."""
        self._quiet.set()
        try:
            yield
        finally:
            self._quiet.clear()

    def start(self) -> Sampler:
        self.baseline_rss = _status_bytes(self.pid, "VmRSS")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def hwm(self) -> int:
        return _status_bytes(self.pid, "VmHWM")

    def _run(self) -> None:
        tick = 0
        while not self._stop.wait(0.1):
            self.max_rss = max(self.max_rss, _status_bytes(self.pid, "VmRSS"))
            tick += 1
            if self.metrics_url and tick % 5 == 0 and not self._quiet.is_set():
                self.scrapes += 1
                for name, value in _scrape(self.metrics_url).items():
                    self.peaks[name] = max(self.peaks.get(name, 0.0), value)


def process_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (the workers of ``kafscale broker --workers N``)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def _status_bytes(pid: int, field_name: str) -> int:
    """A ``/proc/PID/status`` size summed over the process tree (VmHWM: sum of peaks)."""
    total = 0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith(field_name + ":"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
    return total


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process and its live descendants (all threads)."""
    if pid is None:
        return 0.0
    total = 0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        total += sum(int(v) for v in fields[11:13])
    return total / os.sysconf("SC_CLK_TCK")


def quiesce(targets: list[Target], timeout: float = 30.0, window: float = 0.5) -> float:
    """Wait until every target's processes (broker, S3 server) are idle: together under
    5 % of a core over ``window`` s, at most ``timeout`` s; the seconds waited. A broker
    keeps working after a run (its merges start ``--merge-min-age-ms`` later), and on
    two shared cores that work lands in the next target's timed run: the target that ran
    first won by up to 50 % (docs/benchmarks.md, "Round 14")."""
    pids = [p for t in targets for p in (t.pid, t.store_pid) if p]
    start = time.monotonic()
    while time.monotonic() - start < timeout:  # sampling CPU: nothing to wait on
        before = sum(cpu_seconds(p) for p in pids)
        time.sleep(window)
        if sum(cpu_seconds(p) for p in pids) - before < 0.05 * window:
            break
    return time.monotonic() - start


GAUGES = ("kafscale_inflight_bytes", "kafscale_pending_bytes", "kafscale_segment_cache_bytes")
LEASE_GAP = "kafscale_lease_refresh_gap_max_seconds"  # keep-alive starvation under load


def _scrape(url: str) -> dict[str, float]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in GAUGES or name == LEASE_GAP:
            out[name] = float(value)
    return out


def consecutive_free_ports(n: int) -> int:
    """The first of ``n`` consecutive free loopback ports (a ``--workers n`` broker)."""
    from tests.fixtures.broker import free_port

    for _ in range(100):
        base = free_port()
        try:
            for p in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
    raise RuntimeError("no run of free ports")


def _wait_listening(port: int, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:  # start-up only
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


@contextlib.contextmanager
def broker_target(
    name: str, workdir: Path, store_url: str | None, limits: BrokerLimits, extra: list[str],
    meta_url: str | None = None, workers: int = 1,
) -> Iterator[Target]:  # fmt: skip
    """A broker process; target ``noval`` runs it without full produce validation
    (``bench.noval_broker``: the internal ``BrokerConfig.validate_records`` switched off);
    with ``workers`` > 1 a ``--workers`` supervisor (CPU and RSS: summed over its tree)."""
    from tests.fixtures.broker import start_broker

    http, port = consecutive_free_ports(workers), consecutive_free_ports(workers)
    args = ["--http", f"127.0.0.1:{http}", "--log-level", "WARNING", *limits.args(), *extra,
            "--workers", str(workers)]  # fmt: skip
    module = "bench.noval_broker" if name == "noval" else "broker.cli"
    broker = start_broker(
        workdir, store_url=store_url, meta_url=meta_url, port=port, extra_args=tuple(args),
        module=module,
    )  # fmt: skip
    for i in range(1, workers):
        _wait_listening(port + i)
    try:
        yield Target(
            name,
            broker.bootstrap,
            broker.pid,
            f"http://127.0.0.1:{http}/metrics",
            (limits.broker_inflight_bytes + limits.cache_bytes) * workers,
            flush_interval_ms(extra, bool(store_url and store_url.startswith("s3://"))),
        )
    finally:
        broker.stop()


def built_extensions(tree: Path) -> Path:
    """``tree`` with its C extensions built in place where they are not: an export of a
    commit (``git archive``) has none, and its broker would run the pure-Python
    fallbacks, slower than that commit's code really is. Compiled as ``setup.py`` would
    (its flags), with the compiler Python was built with."""
    import sysconfig

    suffix = str(sysconfig.get_config_var("EXT_SUFFIX"))
    cc = str(sysconfig.get_config_var("CC") or "cc").split()[0]
    for src in sorted(tree.glob("*/_*.c")):
        out = src.with_name(src.stem + suffix)
        if out.exists() or not (src.parent / "__init__.py").exists():
            continue
        print(f"building {out.relative_to(tree)} in {tree}", file=sys.stderr, flush=True)
        subprocess.run([cc, "-shared", "-fPIC", "-O2", "-std=c11", "-I", str(tree),
                        "-I", sysconfig.get_paths()["include"], str(src), "-o", str(out)],
                       check=True)  # fmt: skip
    return tree


def broker_env(tree: Path | None) -> dict[str, str]:
    """The environment of a broker process: this one's without ``KAFSCALE_*`` (no fault
    checkpoints or settings leak in), running ``tree``'s code when one is given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
    if tree is not None:
        env["PYTHONPATH"] = str(built_extensions(tree).resolve())
    return env


@contextlib.contextmanager
def base_target(
    workdir: Path, tree: Path, limits: BrokerLimits, extra: list[str]
) -> Iterator[Target]:
    """The ``local`` broker run from another source tree (``--base-tree``: e.g. an export of
    an earlier commit), so that before and after are measured in the same run."""
    from tests.fixtures.broker import BrokerProcess, free_port

    workdir.mkdir(parents=True, exist_ok=True)
    port, http = free_port(), free_port()
    # one process, as the ``local`` target (--workers defaults to the cores with etcd)
    args = ["--listen", f"127.0.0.1:{port}", "--http", f"127.0.0.1:{http}",
            "--log-level", "WARNING", *limits.args(), *extra, "--workers", "1"]  # fmt: skip
    s3 = any(a.startswith("s3://") for a in extra)
    broker = BrokerProcess(workdir, port, args, broker_env(tree)).start()
    try:
        yield Target("base", broker.bootstrap, broker.pid, f"http://127.0.0.1:{http}/metrics",
                     limits.broker_inflight_bytes + limits.cache_bytes,
                     flush_interval_ms(extra, s3))  # fmt: skip
    finally:
        broker.stop()


@contextlib.contextmanager
def etcd_target(
    name: str, workdir: Path, limits: BrokerLimits, extra: list[str], workers: int
) -> Iterator[Target]:
    """The broker on the local-directory store with a real etcd (``tests/fixtures/etcd.py``),
    as one process (``etcd``) or as ``workers`` processes (``workers``)."""
    from tests.fixtures.etcd import start_etcd

    (workdir / "etcd").mkdir(parents=True, exist_ok=True)
    etcd = start_etcd(workdir / "etcd")
    try:
        with broker_target(
            name, workdir / name, None, limits, extra, etcd.url, workers
        ) as target:  # fmt: skip
            yield target
    finally:
        etcd.stop()


@contextlib.contextmanager
def s3_target(
    workdir: Path, limits: BrokerLimits, extra: list[str], name: str = "s3"
) -> Iterator[Target]:
    from tests.fixtures.s3 import create_bucket, run_seaweedfs

    with run_seaweedfs(S3_VOLUME_MB) as endpoint:
        bucket = create_bucket(endpoint)
        url = endpoint.store_url(bucket, "bench")
        with broker_target(name, workdir, url, limits, extra) as target:
            target.store_pid = endpoint.pid
            yield target


@contextlib.contextmanager
def mock_target(rtt_ms: int = 0) -> Iterator[Target]:
    """librdkafka's mock cluster in a process of its own; ``rtt_ms``: its simulated
    round trip (``test.mock.broker.rtt``; target ``mock+Nms``)."""
    spec = json.dumps({"kind": "mock", "rtt_ms": rtt_ms})
    cmd = [sys.executable, "-m", "bench.broker", "worker", spec]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    def create_topic(name: str, partitions: int) -> None:
        stdin.write(json.dumps({"topic": name, "partitions": partitions}) + "\n")
        stdin.flush()
        line = stdout.readline()
        if not line:
            raise RuntimeError("mock cluster host exited")
        if (error := json.loads(line)["error"]) is not None:
            raise RuntimeError(error)

    try:
        line = stdout.readline()
        if not line:
            raise RuntimeError("mock cluster host exited at start")
        name = f"mock+{rtt_ms}ms" if rtt_ms else "mock"
        yield Target(name, json.loads(line)["bootstrap"], proc.pid, create_mock_topic=create_topic)
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)


def py_spy() -> str:
    """The py-spy executable (the bench extra, in the lock); a one-line exit without it."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        raise SystemExit("py-spy not found: pip install py-spy (the bench extra) into the venv")
    return spy


@contextlib.contextmanager
def profiled(target: Target, phase: str, outdir: Path | None) -> Iterator[None]:
    """With ``outdir``, record the broker with py-spy (collapsed stacks) during a phase."""
    if outdir is None or target.pid is None or target.name == "mock":
        yield
        return
    spy = py_spy()
    outdir.mkdir(parents=True, exist_ok=True)  # py-spy would fail without a word
    out = outdir / f"{target.name}-{phase}.txt"
    cmd = [spy, "record", "--pid", str(target.pid), "--rate", "200", "--format", "raw",
           "--output", str(out), "--nonblocking"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)  # let py-spy attach before the load starts
    try:
        yield
    finally:
        os.kill(proc.pid, signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)
