"""``kafscale broker --workers N``: one broker process per core (docs/architecture.md,
"Every core of a pod").

The supervisor starts N full brokers: worker ``i`` is ``kafscale broker`` with the same
flags and environment, but node id ``--node-id + i`` and ``--port-offset i``: every port
it listens on, advertises or serves HTTP on is the shared configuration's + i, named
``--listener``s included (``shift_ports``). Ports that two workers would share are
refused before any worker starts.
They register in the shared metadata store like any brokers, so partitions and groups
spread over them by rendezvous hashing and clients need no change: a Metadata response
from any worker names all of them. The embedded metadata store belongs to one process,
so there the default is one worker and more are refused (they need ``--meta etcd://``).

The supervisor stops its workers by PID: SIGTERM/SIGINT is passed on as SIGTERM (each
worker flushes and releases its partitions), a second one as SIGKILL. A worker that exits
while the supervisor runs is restarted after ``RESTART_DELAY_S`` (a restarted worker
waits for its previous lease, as any restarted broker). More than ``MAX_RESTARTS`` exits
of one worker in a row, each within ``RESTART_WINDOW_S`` of its start, stop all workers
and exit 1: a worker that cannot start is given up on however slowly a busy machine
starts it (counting exits within a fixed window instead never tripped when each start
took longer than a sixth of it). Workers still running ``FAILED_STOP_GRACE_S`` after
that SIGTERM are killed. Workers get SIGTERM if the supervisor itself dies
(``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from types import FrameType

from broker.config import BrokerConfig

log = logging.getLogger(__name__)

RESTART_DELAY_S = 1.0
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
#: after giving up on a failing worker, how long the others get to stop after SIGTERM
#: before they are killed (nothing else would end a supervisor whose worker hangs)
FAILED_STOP_GRACE_S = 60.0
_PR_SET_PDEATHSIG = 1


def available_cores() -> int:
    """The cores this process may use: its CPU affinity, bounded by a cgroup v2 CPU quota
    (``cpu.max``, what a Kubernetes CPU limit sets)."""
    cores = len(os.sched_getaffinity(0))
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


class WorkersError(ValueError):
    """A ``--workers`` setting that cannot run (a usage error)."""


def worker_count(requested: int | None, meta_url: str) -> int:
    """How many workers: ``requested``, else the available cores; one with the embedded
    metadata store, which cannot be shared between processes."""
    embedded = not meta_url.startswith("etcd://")
    if requested is None:
        return 1 if embedded else available_cores()
    if requested < 1:
        raise WorkersError("--workers must be at least 1")
    if requested > 1 and embedded:
        raise WorkersError(
            "--workers > 1 needs a shared metadata store (--meta etcd://...): "
            "the embedded store belongs to one process"
        )
    return requested


def _with_port(value: tuple[str, int], offset: int) -> str:
    host, port = value
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{port + offset}"


def shift_ports(config: BrokerConfig, offset: int) -> BrokerConfig:
    """``config`` with ``offset`` added to every port it listens on or advertises: the
    Kafka listener, every named listener and the HTTP port (``--port-offset``, which the
    supervisor gives worker ``i``). Port 0 (any free port) stays 0."""
    if offset == 0:
        return config

    def add(port: int) -> int:
        return port + offset if port else port

    http = config.http
    if http:
        from broker.cli_broker import hostport

        host, port = hostport(http)
        if port:
            http = _with_port((host, add(port)), 0)
    security = config.security
    if security is not None and security.listeners:
        moved = tuple(
            replace(x, port=add(x.port), advertised_port=add(x.advertised_port))
            for x in security.listeners
        )
        security = replace(security, listeners=moved)
    return replace(
        config,
        listen_port=add(config.listen_port),
        advertised_port=add(config.advertised_port),
        http=http,
        security=security,
    )


def bound_ports(config: BrokerConfig) -> list[int]:
    """The ports one broker with ``config`` binds (Kafka listeners and HTTP)."""
    ports = [config.listen_port]
    if config.security is not None and config.security.listeners:
        ports = [x.port for x in config.security.listeners]
    if config.http:
        from broker.cli_broker import hostport

        port = hostport(config.http)[1]
        if port:
            ports.append(port)
    return [p for p in ports if p]


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    """The flags that make worker ``index`` distinct from the others: its node id and its
    port offset (every port of the shared configuration + ``port_offset``)."""

    index: int
    node_id: int
    port_offset: int
    advertised: tuple[str, int]

    def args(self) -> list[str]:
        return [
            "--workers", "1", "--node-id", str(self.node_id),
            "--port-offset", str(self.port_offset),
        ]  # fmt: skip


def plan_workers(n: int, config: BrokerConfig, base_offset: int = 0) -> list[WorkerPlan]:
    """Worker ``i``: node id + i, every port + i (``config`` is the shared configuration,
    its ports already shifted by ``base_offset``, a ``--port-offset`` of the supervisor's
    own). Raises WorkersError when two workers would bind the same port."""
    seen: dict[int, int] = {}
    plans = []
    for i in range(n):
        shifted = shift_ports(config, i)
        for port in bound_ports(shifted):
            if port in seen:
                raise WorkersError(
                    f"--workers {n}: port {port} of worker {i} is also worker {seen[port]}'s "
                    "(each worker adds its index to every port): space the listener and "
                    "HTTP ports at least --workers apart"
                )
            seen[port] = i
        plans.append(
            WorkerPlan(
                i,
                config.node_id + i,
                base_offset + i,
                (shifted.advertised_host, shifted.advertised_port),
            )
        )
    return plans


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


@dataclass
class _Worker:
    plan: WorkerPlan
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    quick_exits: int = 0  # exits in a row, each within RESTART_WINDOW_S of its start
    restart_at: float = 0.0


class Supervisor:
    """Runs the workers until a signal, or until one keeps failing."""

    def __init__(self, base_argv: Sequence[str], plans: list[WorkerPlan]) -> None:
        self.base_argv = list(base_argv)
        self.workers = [_Worker(p) for p in plans]
        self.stopping = 0  # signals received
        self.failed = False
        self.kill_at: float | None = None  # when failed: SIGKILL for workers still running

    def _spawn(self, w: _Worker) -> None:
        cmd = [sys.executable, "-m", "broker.cli", "broker", *self.base_argv, *w.plan.args()]
        w.proc = subprocess.Popen(cmd, start_new_session=True, preexec_fn=_die_with_parent)
        w.started_at = time.monotonic()
        log.info(
            "worker %d started: pid %d, node id %d, %s",
            w.plan.index,
            w.proc.pid,
            w.plan.node_id,
            _with_port(w.plan.advertised, 0),
        )

    def _signal(self, signum: int, _frame: FrameType | None) -> None:
        self.stopping += 1
        sig = signal.SIGTERM if self.stopping == 1 else signal.SIGKILL
        log.info("signal %d: stopping %d workers (%s)", signum, len(self.workers), sig.name)
        self._send(sig)

    def _send(self, sig: signal.Signals) -> None:
        for w in self.workers:
            if w.proc is not None and w.proc.poll() is None:
                try:
                    os.kill(w.proc.pid, sig)
                except ProcessLookupError:
                    pass

    def _reaped(self, w: _Worker, code: int) -> None:
        log.log(
            logging.INFO if self.stopping else logging.WARNING,
            "worker %d (pid %d) exited with %d",
            w.plan.index,
            w.proc.pid if w.proc else -1,
            code,
        )
        w.proc = None
        if self.stopping or self.failed:
            return
        now = time.monotonic()
        quick = now - w.started_at < RESTART_WINDOW_S
        w.quick_exits = w.quick_exits + 1 if quick else 1
        if w.quick_exits > MAX_RESTARTS:
            log.error("worker %d keeps exiting: stopping all workers", w.plan.index)
            self.failed = True
            self.kill_at = now + FAILED_STOP_GRACE_S
            self._send(signal.SIGTERM)
            return
        w.restart_at = now + RESTART_DELAY_S

    def run(self) -> int:
        """Event-driven: SIGCHLD, SIGTERM and SIGINT wake the loop through a wakeup fd;
        the only timeout is a pending restart's delay."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        old_fd = signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda _s, _f: None)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._signal)
        try:
            for w in self.workers:
                self._spawn(w)
            while not self._step():
                timeout = self._next_timer()
                timeout = None if timeout is None else max(0.0, timeout - time.monotonic())
                if select.select([wake_r], [], [], timeout)[0]:
                    os.read(wake_r, 512)
        finally:
            signal.set_wakeup_fd(old_fd)
            os.close(wake_r)
            os.close(wake_w)
        return 1 if self.failed else 0

    def _next_timer(self) -> float | None:
        """When the loop must wake without a signal: a pending restart while running; once
        stopping, only the kill of workers that outlived FAILED_STOP_GRACE_S (set when the
        supervisor gave up on a failing worker)."""
        if self.stopping or self.failed:
            return self.kill_at
        due = [w.restart_at for w in self.workers if w.proc is None]
        return min(due) if due else None

    def _step(self) -> bool:
        """Reap exited workers, restart those due; True once everything has stopped."""
        for w in self.workers:
            if w.proc is not None and (code := w.proc.poll()) is not None:
                self._reaped(w, code)
        if self.stopping or self.failed:
            left = [w for w in self.workers if w.proc is not None]
            if left and self.kill_at is not None and time.monotonic() >= self.kill_at:
                for w in left:
                    log.error(
                        "worker %d (pid %d) still runs %.0f s after SIGTERM: killing it",
                        w.plan.index,
                        w.proc.pid if w.proc else -1,
                        FAILED_STOP_GRACE_S,
                    )
                self.kill_at = None
                self._send(signal.SIGKILL)
            return not left
        for w in self.workers:
            if w.proc is None and time.monotonic() >= w.restart_at:
                self._spawn(w)
        return False


def workers_for(argv: Sequence[str], config: BrokerConfig) -> int:
    """The number of workers ``kafscale broker argv`` runs (raises WorkersError)."""
    from broker.cli_broker import broker_parser

    requested = vars(broker_parser().parse_args(argv))["workers"]
    if requested is None and config.security is not None and config.security.listeners:
        # named listeners usually sit on neighbouring ports (9093, 9094, ...), which
        # worker i's port + i would collide with: more workers only when asked for
        return 1
    return worker_count(requested, config.meta_url)


def supervise(argv: Sequence[str], config: BrokerConfig, n: int) -> int:
    """Run ``n`` workers of ``kafscale broker argv``; returns the exit code (2 when the
    workers' ports would collide)."""
    from broker.cli_broker import broker_parser

    base_offset = vars(broker_parser().parse_args(argv))["port_offset"] or 0
    try:
        plans = plan_workers(n, config, base_offset)
    except WorkersError as exc:
        log.error("%s", exc)
        return 2
    log.info("starting %d broker workers, node ids %d..%d", n, plans[0].node_id, plans[-1].node_id)
    return Supervisor(argv, plans).run()
