"""bench.paced_tail against a real broker process (local store, embedded metadata): a
short paced trial delivers every message and reports its latencies and the broker's
CPU. The broker is stopped by its PID."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.broker_run import create_topics
from bench.broker_targets import BrokerLimits, broker_target
from bench.paced_tail import burst, trial


def test_a_short_paced_trial_measures_the_broker(tmp_path: Path) -> None:
    args = argparse.Namespace(
        rate=300.0,
        seconds=2.0,
        idempotent=True,
        burst_mb=0,
        scrape_s=0,
        lag_partitions=0,
        broker_arg=[],
    )
    r = trial(None, args, tmp_path / "b")
    assert 0 < r["p50_ms"] <= r["p99_ms"] <= r["max_ms"]
    assert r["cpu_ms_mb"] > 0
    assert 0 <= r["stalls_20"] <= r["stalls"]


def test_a_burst_delivers_every_message_before_it_returns(tmp_path: Path) -> None:
    """``burst`` (the full-speed write before a ``--burst-mb`` trial) returns once the
    broker acknowledged every message: the topic's end is the burst's message count."""
    with broker_target("local", tmp_path / "b", None, BrokerLimits(), []) as t:
        create_topics(t.bootstrap, ["burst"], 1)
        burst(t.bootstrap, 2.0)
        assert _end(t.bootstrap, "burst") == int(2e6 / 1024)


def test_a_trial_after_a_burst_still_measures_every_paced_message(tmp_path: Path) -> None:
    args = argparse.Namespace(rate=300.0, seconds=1.0, idempotent=False, burst_mb=1.0,
                              scrape_s=0, lag_partitions=0, broker_arg=[])  # fmt: skip
    r = trial(None, args, tmp_path / "b")
    assert 0 < r["p50_ms"] <= r["p99_ms"] <= r["max_ms"]
    assert r["cpu_ms_mb"] > 0
    assert r["scrapes"] == 0


def test_a_trial_with_scrapes_gets_the_lag_metrics_while_it_produces(tmp_path: Path) -> None:
    args = argparse.Namespace(rate=300.0, seconds=2.0, idempotent=True, burst_mb=0,
                              scrape_s=0.2, lag_partitions=60, broker_arg=[])  # fmt: skip
    r = trial(None, args, tmp_path / "b")
    assert r["scrapes"] >= 1  # at least one whole body read while the producer ran
    assert r["lag_series"] == 60  # the group's lag, a series per partition
    assert r["scrape_lines"] > 2 * 60  # and a committed-offset series each
    assert 0 < r["p50_ms"] <= r["p99_ms"]


def _end(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "paced-tail-test"})
    try:
        _low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        return int(high)
    finally:
        c.close()
