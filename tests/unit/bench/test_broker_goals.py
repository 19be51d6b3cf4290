"""Issue 13's goals judged from one run's figures (``bench/broker_goals.py``)."""

from __future__ import annotations

from typing import Any

from bench.broker_goals import GOALS, format_flatness, format_goals, judge
from bench.broker_run import MB

MIB = 1 << 20


def _phase(mbs: float, cpu_ms_per_mb: float = 1.0, **extra: Any) -> dict[str, Any]:
    n = int(mbs * MB)
    return {"messages": 1000, "bytes": n, "seconds": 1.0, "errors": 0,
            "server_cpu_s": cpu_ms_per_mb * mbs / 1000, "steady_messages": 1000,
            "steady_bytes": n, "steady_seconds": 1.0, **extra}  # fmt: skip


def _paced(p99: float, put_p99: float, commit_p99: float) -> dict[str, Any]:
    return _phase(2, p50_ms=p99 / 2, p99_ms=p99, flush_interval_ms=2.0, put_p99_ms=put_p99,
                  commit_p99_ms=commit_p99)  # fmt: skip


def _memory(growth_mib: float) -> dict[str, Any]:
    peak = int((60 + growth_mib) * MIB)
    return {"baseline_rss": 60 * MIB, "max_rss": peak, "hwm_rss": peak,
            "limit_bytes": 128 * MIB, "peaks": {}}  # fmt: skip


# fmt: off
def _run() -> dict[str, dict[str, Any]]:
    return {
        "local": {"produce": _phase(500, 1.0), "produce_idem": _phase(240, 2.0),
                  "consume_cached": _phase(700, 0.4), "paced": _paced(8.0, 2.0, 1.0),
                  "memory": _memory(150)},
        "s3": {"produce": _phase(400, 1.1), "produce_idem": _phase(60, 2.8),
               "consume_cached": _phase(800, 1.2), "paced": _paced(9.0, 5.0, 3.0),
               "memory": _memory(240)},
        "mock": {"produce": _phase(800, 0.1), "produce_idem": _phase(800, 0.1)},
    }
# fmt: on


def _verdicts(text: str) -> dict[tuple[str, str], str]:
    out = {}
    for line in text.splitlines()[1:]:
        target, rest = line.split(None, 1)
        label = next(g.label for g in GOALS if rest.startswith(g.label))
        out[(target, label)] = "NOT met" if line.endswith("NOT met") else line.split()[-1]
    return out


def test_each_goal_against_its_counterpart_from_the_same_run() -> None:
    verdicts = _verdicts(format_goals(_run()))
    assert verdicts == {
        ("local", "plain produce: server CPU ms/MB <= 3"): "met",
        ("local", "idempotent produce: server CPU ms/MB <= 3.5"): "met",
        ("local", "consume from cache: server CPU ms/MB <= 1"): "met",
        ("s3", "consume from cache: server CPU ms/MB <= 1"): "NOT met",  # 1.2
        ("local", "plain produce MB/s >= 0.6 x the mock's"): "met",  # 500 / 800
        ("local", "idempotent produce MB/s >= 0.6 x the mock's"): "NOT met",  # 240 / 800
        ("s3", "plain produce MB/s >= 0.7 x the local store's"): "met",  # 400 / 500
        ("s3", "idempotent produce MB/s >= 0.7 x the local store's"): "NOT met",  # 60 / 240
        ("s3", "paced p99 ms <= flush interval + PUT p99 + txn p99"): "met",  # 9 <= 2 + 5 + 3
        ("local", "paced p99 ms <= flush interval + PUT p99 + txn p99"): "NOT met",  # 8 > 5
        ("local", "RSS growth MiB <= buffers + 100"): "met",  # 150 <= 228
        ("s3", "RSS growth MiB <= buffers + 100"): "NOT met",  # 240 > 228
    }


def test_the_figures_are_printed_beside_their_counterparts() -> None:
    text = format_goals(_run())
    assert "500.0 / 800.0 (mock) = 0.625" in text
    assert "60.0 / 240.0 (local) = 0.250" in text
    assert "8.00 / 5.00" in text  # local paced p99 against 2 + 2 + 1
    assert "150.00 / 228.00" in text


def test_a_goal_flips_with_its_figure() -> None:
    run = _run()
    paced = next(g for g in GOALS if g.target == "s3" and g.phase == "paced")
    run["s3"]["paced"]["p99_ms"] = 10.0
    assert judge(paced, run) == (10.0, 10.0, True)  # at the budget: met
    run["s3"]["paced"]["p99_ms"] = 10.5
    assert judge(paced, run) == (10.5, 10.0, False)
    run["local"]["produce_idem"] = _phase(240, 3.6)
    assert (
        _verdicts(format_goals(run))[("local", "idempotent produce: server CPU ms/MB <= 3.5")]
        == "NOT met"
    )


def test_goals_without_their_figures_are_left_out() -> None:
    run = _run()
    del run["s3"], run["mock"]
    text = format_goals(run)
    assert " s3 " not in text and "mock" not in text
    assert "plain produce: server CPU ms/MB <= 3" in text
    assert format_goals({"mock": run.get("mock", {})}).endswith("none of their figures")


def test_a_partition_sweep_is_flat_within_20_percent_or_not() -> None:
    def point(n: int, mbs: float, p99: float) -> dict[str, Any]:
        return {"partitions": n, "mbs": mbs, "p99_ms": p99}

    sweep = {
        "local": [point(1, 200.0, 400.0), point(100, 180.0, 450.0), point(1000, 170.0, 480.0)],
        "etcd": [point(1, 220.0, 300.0), point(100, 320.0, 310.0), point(1000, 100.0, 900.0)],
    }
    lines = format_flatness(sweep).splitlines()[1:]
    assert lines[0].startswith("  local   MB/s at 1/100/1000 partitions: 200.0/180.0/170.0;")
    assert lines[0].endswith("= 0.85  met")  # 170 / 200
    assert lines[1].endswith("= 0.83  met")  # 400 / 480
    assert lines[2].endswith("= 0.31  NOT met")  # 100 / 320
    assert lines[3].endswith("= 0.33  NOT met")  # 300 / 900
    assert "two partition counts" in format_flatness({"local": [point(1, 1.0, 1.0)]})


def test_the_mock_in_a_partition_sweep_is_the_counterpart_not_judged() -> None:
    def point(n: int, mbs: float, p99: float) -> dict[str, Any]:
        return {"partitions": n, "mbs": mbs, "p99_ms": p99}

    sweep = {
        "local": [point(1, 250.0, 400.0), point(1000, 100.0, 900.0)],
        "mock": [point(1, 800.0, 50.0), point(1000, 200.0, 60.0)],
    }
    lines = format_flatness(sweep).splitlines()[1:]
    assert lines[0].endswith("= 0.40  NOT met")
    assert lines[2] == "  local   MB/s / the mock's at 1/1000 partitions: 0.31/0.50"
    assert lines[3].startswith("  mock    MB/s at 1/1000 partitions: 800.0/200.0;")
    assert lines[3].endswith("= 0.25  counterpart")
    assert lines[4].endswith("= 0.83  counterpart")  # flat, but not judged either way
    assert len(lines) == 5  # no share line for the mock itself
