"""broker/workers.py: how many workers, and what makes each one distinct (no process)."""

from __future__ import annotations

import os

import pytest

from broker.cli_broker import config_from_args
from broker.workers import WorkersError, available_cores, plan_workers, worker_count, workers_for


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
    plans = plan_workers(3, 40, ("0.0.0.0", 9092), ("10.0.0.5", 19092), ("0.0.0.0", 8080))
    assert [p.node_id for p in plans] == [40, 41, 42]
    assert plans[2].args() == [
        "--workers", "1", "--node-id", "42", "--listen", "0.0.0.0:9094",
        "--advertised-listener", "10.0.0.5:19094", "--http", "0.0.0.0:8082",
    ]  # fmt: skip
    v6 = plan_workers(2, 0, ("::", 9092), ("::1", 9092), None)[1].args()
    assert v6[-4:] == ["--listen", "[::]:9093", "--advertised-listener", "[::1]:9093"]
    # the flags given last win: a worker's command line ends with them
    config, _ = config_from_args(["--node-id", "40", "--listen", "0.0.0.0:9092", *plans[1].args()])
    assert (config.node_id, config.listen_port, config.advertised_port) == (41, 9093, 19093)


def test_named_listeners_run_one_worker_unless_more_are_asked_for() -> None:
    argv = ["--meta", "etcd://h:1", "--listener", "SASL_PLAINTEXT://127.0.0.1:9093"]
    assert workers_for(argv, config_from_args(argv)[0]) == 1  # not one per core
    argv += ["--workers", "2"]
    with pytest.raises(WorkersError, match="--listener"):
        workers_for(argv, config_from_args(argv)[0])
