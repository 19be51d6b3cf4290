"""broker/workers.py: how many workers, and what makes each one distinct (no process)."""

from __future__ import annotations

import os

import pytest

from broker.cli_broker import config_from_args
from broker.workers import (
    Supervisor,
    WorkersError,
    available_cores,
    plan_workers,
    worker_count,
    workers_for,
)


def test_default_is_the_available_cores_with_etcd_and_one_embedded() -> None:
    assert 1 <= available_cores() <= len(os.sched_getaffinity(0))
    assert worker_count(None, "etcd://127.0.0.1:2379") == available_cores()
    assert worker_count(None, "embedded") == 1
    assert worker_count(3, "etcd://h:1") == 3
    assert worker_count(1, "embedded") == 1


def test_more_than_one_worker_on_the_embedded_store_is_refused() -> None:
    with pytest.raises(WorkersError, match="etcd"):
        worker_count(2, "embedded")
    with pytest.raises(WorkersError):
        worker_count(0, "etcd://h:1")


def test_the_flag_and_its_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["--meta", "etcd://h:1", "--workers", "4"]
    assert workers_for(argv, config_from_args(argv)[0]) == 4
    monkeypatch.setenv("KAFSCALE_WORKERS", "3")
    argv = ["--meta", "etcd://h:1"]
    assert workers_for(argv, config_from_args(argv)[0]) == 3


def test_each_worker_gets_its_own_node_id_and_ports() -> None:
    base = ["--meta", "etcd://h:1", "--node-id", "40", "--listen", "0.0.0.0:9092",
            "--advertised-listener", "10.0.0.5:19092", "--http", "0.0.0.0:8080"]  # fmt: skip
    config, _ = config_from_args(base)
    plans = plan_workers(3, config)
    assert [p.node_id for p in plans] == [40, 41, 42]
    assert plans[2].args() == ["--workers", "1", "--node-id", "42", "--port-offset", "2"]
    assert plans[2].advertised == ("10.0.0.5", 19094)
    # a worker's command line is the shared one plus its own flags: the last ones win, and
    # a HOST:PORT --advertised-listener given on the shared line is not repeated
    worker, _ = config_from_args([*base, *plans[1].args()])
    assert (worker.node_id, worker.listen_port, worker.advertised_port) == (41, 9093, 19093)
    assert worker.http == "0.0.0.0:8081"
    v6, _ = config_from_args(
        ["--listen", "[::]:9092", "--http", "[::1]:8080", "--port-offset", "1"]
    )
    assert (v6.listen_host, v6.listen_port, v6.http) == ("::", 9093, "[::1]:8081")


def test_named_listeners_move_with_the_worker() -> None:
    base = ["--meta", "etcd://h:1", "--listen", "127.0.0.1:9092",
            "--listener", "SASL_SSL://0.0.0.0:9192", "--listener", "SSL://0.0.0.0:9292",
            "--advertised-listener", "127.0.0.1:9092",
            "--advertised-listener", "SASL_SSL://pod:9192",
            "--advertised-listener", "SSL://pod:9292",
            "--ssl-cert", "c.pem", "--ssl-key", "k.pem"]  # fmt: skip
    assert workers_for(base, config_from_args(base)[0]) == 1  # by default: one
    argv = [*base, "--workers", "2"]
    assert workers_for(argv, config_from_args(argv)[0]) == 2
    plans = plan_workers(2, config_from_args(base)[0])
    worker, _ = config_from_args([*base, *plans[1].args()])
    assert worker.security is not None
    got = {
        (x.name, x.port, x.advertised_host, x.advertised_port) for x in worker.security.listeners
    }
    assert got == {("PLAINTEXT", 9093, "127.0.0.1", 9093), ("SASL_SSL", 9193, "pod", 9193),
                   ("SSL", 9293, "pod", 9293)}  # fmt: skip


def test_workers_whose_ports_would_collide_are_refused() -> None:
    config, _ = config_from_args(
        ["--meta", "etcd://h:1", "--listen", "127.0.0.1:9092", "--http", "127.0.0.1:9093"]
    )
    with pytest.raises(WorkersError, match="port 9093 of worker 1 is also worker 0's"):
        plan_workers(2, config)
    assert len(plan_workers(1, config)) == 1


def test_the_supervisor_wakes_only_for_a_due_restart_or_the_kill() -> None:
    """Without a signal the loop wakes for a pending restart while running, for nothing
    while stopping on a signal (it spun at a past restart time until the workers exited),
    and for the kill once it has given up on a failing worker."""
    config, _ = config_from_args(["--meta", "etcd://h:1"])
    sup = Supervisor([], plan_workers(2, config))
    sup.workers[0].restart_at = 12.5  # both exited (no process), one restart due later
    sup.workers[1].restart_at = 7.0
    assert sup._next_timer() == 7.0
    sup.stopping = 1
    assert sup._next_timer() is None
    sup.stopping, sup.failed, sup.kill_at = 0, True, 99.0
    assert sup._next_timer() == 99.0
    sup.kill_at = None  # the kill was sent
    assert sup._next_timer() is None
