"""The benchmark harness's pure parts: pacing, the median trial, the report table.
(The harness itself is run by hand: ``python -m bench.broker --quick``.)"""

from __future__ import annotations

import time
from typing import Any

import pytest

from bench.broker_report import format_table
from bench.broker_run import MB, QUICK, Plan, _median, _phase_specs
from bench.broker_targets import Target
from bench.broker_workers import PACE_SLICE_S, pace


class _Polls:
    """What ``pace`` asks of a producer: each ``poll`` timeout (librdkafka waits whole
    milliseconds: a shorter one returns at once), honoured as a sleep."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def poll(self, timeout: float) -> int:
        self.timeouts.append(timeout)
        time.sleep(timeout)
        return 0


def test_pace_never_polls_for_less_than_a_millisecond() -> None:
    """A sub-millisecond wait is slept in slices with a ``poll(0)`` after each, so that
    pacing neither spins on ``poll`` (the paced producer spun a whole core before) nor
    leaves delivery reports unread for longer than a slice."""
    for wait in (0.0003, 0.0025, 0.02):
        polls = _Polls()
        until = time.perf_counter() + wait
        pace(polls, until)
        assert time.perf_counter() >= until
        assert polls.timeouts, "no delivery reports served while waiting"
        assert all(t == 0 or t >= 0.001 for t in polls.timeouts), polls.timeouts
    polls = _Polls()
    pace(polls, time.perf_counter() + 0.0009)  # under a millisecond: slices, each polled
    assert polls.timeouts and set(polls.timeouts) == {0}
    assert PACE_SLICE_S < 0.001


def test_client_nice_reaches_every_phase_and_the_heading() -> None:
    """``--client-nice`` runs every client of every phase at that nice value, and the
    report says so (a figure measured that way is never mistaken for the default)."""
    created: list[tuple[str, int]] = []

    def mock() -> Target:  # the mock's host creates its topics (bench/mock_cluster.py)
        return Target("mock", "127.0.0.1:1", create_mock_topic=lambda *t: created.append(t))

    plan = Plan(1000, 2000, 1.0, 3, client_nice=19)
    specs = _phase_specs(mock(), plan, "r")
    assert specs and all(spec["nice"] == 19 for spec in specs.values())
    assert {spec["topic"] for spec in specs.values()} == {n for n, _ in created}
    assert {p for _n, p in created} == {3}  # the plan's partitions, not the mock's 4
    assert all(spec["nice"] == 0 for spec in _phase_specs(mock(), QUICK, "r").values())
    figures = {"produce": _produce(800.0, 1.0)}
    assert "clients at nice 19" in format_table({"mock": figures}, plan)
    assert "nice" not in format_table({"mock": figures}, QUICK)


def _produce(mbs: float, p50: float) -> dict[str, Any]:
    return {"messages": 1000, "bytes": int(mbs * MB), "seconds": 1.0, "errors": 0,
            "p50_ms": p50, "p99_ms": 2 * p50}  # fmt: skip


def _consume(mbs: float) -> dict[str, Any]:
    n = int(mbs * MB)
    return {"messages": 1000, "bytes": n, "seconds": 2.0, "errors": 0,
            "steady_messages": 1000, "steady_bytes": n, "steady_seconds": 1.0}  # fmt: skip


def test_median_trial_by_throughput_or_paced_latency() -> None:
    trials = [_produce(10, 1), _produce(30, 9), _produce(20, 5)]
    assert _median(trials, "produce")["bytes"] == 20 * MB
    assert _median(trials, "paced")["p50_ms"] == 5
    # a paced run is kept by its p99: one stall in one trial does not make the figure
    stalled = {**_produce(2, 4.3), "p99_ms": 34.4}
    kept = _median([{**_produce(2, 4.7), "p99_ms": 8.1}, {**_produce(2, 4.3), "p99_ms": 7.4},
                    stalled], "paced_plain")  # fmt: skip
    assert kept["p99_ms"] == 8.1


def test_table_has_ratios_and_memory_verdicts() -> None:
    def target(mbs: float) -> dict[str, Any]:
        return {"produce": _produce(mbs, 3), "produce_idem": _produce(mbs / 2, 4),
                "paced": _produce(2, 5), "consume": _consume(2 * mbs)}  # fmt: skip

    results = {"local": target(50), "mock": target(200)}
    results["local"]["memory"] = {"baseline_rss": 40 << 20, "max_rss": 100 << 20,
                                  "hwm_rss": 101 << 20, "limit_bytes": 128 << 20,
                                  "peaks": {"kafscale_inflight_bytes": float(1 << 20)}}  # fmt: skip
    text = format_table(results, QUICK)
    rows = {line.split("  ")[0]: line.split() for line in text.splitlines()}
    assert rows["produce MB/s (acks=all)"][-3:] == ["50.0", "200.0", "0.25"]
    assert rows["consume MB/s"][-3:] == ["100.0", "400.0", "0.25"]
    assert "growth 60 within limits 128" in text
    results["local"]["memory"]["max_rss"] = 300 << 20
    assert "OVER limits 128" in format_table(results, QUICK)


def test_table_has_every_process_cpu_and_the_cores_busy() -> None:
    local = {**_produce(100, 3), "cpu_seconds": 0.8, "server_cpu_s": 0.15, "store_cpu_s": 0.05}
    mock = {**_produce(400, 1), "cpu_seconds": 1.2, "server_cpu_s": 0.04}
    text = format_table({"local": {"produce": local}, "mock": {"produce": mock}}, QUICK)
    rows = {line.split("  ")[0]: line.split() for line in text.splitlines()}
    assert rows["client CPU ms/MB, produce"][-3:] == ["8.00", "3.00", "2.67"]
    assert rows["all processes' CPU ms/MB, produce"][-3:] == ["10.0", "3.10", "3.23"]
    assert rows["cores busy, produce"][-3:] == ["1.00", "1.24", "0.81"]
    assert rows["client CPU ms/MB, idempotent"][-3:] == ["-", "-", "-"]  # no such phase


def test_table_breaks_the_idempotent_round_trip_down() -> None:
    """docs/benchmarks.md, "Round 27": the time between the client's requests beside the
    broker's means of the request, its PUT and its metadata transaction."""
    idem = {**_produce(100, 2), "broker_count": 400, "broker_mean_ms": 2.9,
            "put_mean_ms": 1.9, "commit_mean_ms": 0.45}  # fmt: skip
    mock = _produce(400, 2)
    text = format_table({"local": {"produce_idem": idem}, "mock": {"produce_idem": mock}}, QUICK)
    rows = {line.strip().split("  ")[0]: line.split() for line in text.splitlines()}
    interval = idem["seconds"] * 1000 / 400
    assert rows["idempotent: ms between requests"][-3:] == [f"{interval:.2f}", "-", "-"]
    assert rows["idempotent: broker Produce mean ms"][-3:] == ["2.90", "-", "-"]
    assert rows["idempotent: segment PUT mean ms"][-3:] == ["1.90", "-", "-"]
    assert rows["idempotent: metadata txn mean ms"][-3:] == ["0.45", "-", "-"]


def test_the_java_partition_sweep_refuses_the_mock_before_starting_anything() -> None:
    from bench.broker import main

    argv = ["--quick", "--targets", "local,mock", "--partition-sweep", "1",
            "--sweep-client", "java"]  # fmt: skip
    with pytest.raises(SystemExit, match="cannot produce to the mock cluster"):
        main(argv)
