"""The paced-p99 budget's parts (bench/broker_waits.py): quantiles of the broker's
histograms between two scrapes."""

from __future__ import annotations

import math

from bench.broker_waits import quantile, scrape_buckets, waits


def test_quantile_of_what_happened_between_two_scrapes() -> None:
    before = {0.01: 10.0, 0.02: 10.0, 0.05: 10.0, math.inf: 10.0}
    # 100 new observations: 50 at <= 10 ms, 40 in (10, 20], 10 in (20, 50]
    after = {0.01: 60.0, 0.02: 100.0, 0.05: 110.0, math.inf: 110.0}
    p50, n = quantile(before, after, 0.5)
    assert n == 100 and math.isclose(p50, 10.0)
    p99, _ = quantile(before, after, 0.99)
    assert math.isclose(p99, 20 + 30 * 0.9)  # 9 of the last bucket's 10, interpolated
    assert math.isnan(quantile(after, after, 0.99)[0])


def test_waits_names_what_the_broker_exports() -> None:
    put = "kafscale_segment_put_duration_seconds"
    got = waits({}, {put: {0.001: 5.0, math.inf: 5.0}})
    assert got == {"put_p99_ms": 0.001 * 1000 * 0.99, "put_count": 5, "put_max_ms": 1.0}
    # one stall above ~500 fast PUTs: beyond their p99, within their max
    buckets = {0.001: 500.0, 0.25: 500.0, 0.5: 501.0, math.inf: 501.0}
    got = waits({put: {0.001: 100.0, 0.25: 100.0, 0.5: 100.0, math.inf: 100.0}}, {put: buckets})
    assert got["put_count"] == 401 and got["put_p99_ms"] <= 1.0 and got["put_max_ms"] == 500.0
    assert waits({}, {}) == {}


def test_broker_side_histograms_and_merges_during_a_phase() -> None:
    """Round 4 (docs/benchmarks.md): the broker's Produce p99, per request and per byte,
    and the segments its maintenance merged meanwhile (a counter's growth)."""
    produce = "kafscale_produce_request_duration_seconds"
    per_byte = "kafscale_produce_byte_duration_seconds"
    merged = "kafscale_maintenance_merged_segments_total"
    before = {merged: {math.inf: 7.0}}
    after = {
        produce: {0.002: 99.0, 0.1: 100.0, math.inf: 100.0},
        per_byte: {0.002: 99_000.0, 0.1: 199_000.0, math.inf: 199_000.0},
        merged: {math.inf: 19.0},
    }
    got = waits(before, after)
    assert got["broker_count"] == 100 and got["broker_p99_ms"] <= 2.0
    # one slow request in 100, but half the bytes: per byte its latency is the p99
    assert got["bytes_p99_ms"] > 50.0
    assert got["merged"] == 12


def test_means_come_from_the_histograms_sums() -> None:
    """A mean is exact where a quantile is interpolated in its bucket: 10 PUTs of this
    phase took 0.031 s together, whatever buckets they fell in."""
    put = "kafscale_segment_put_duration_seconds"
    before = {put: {0.01: 5.0, math.inf: 5.0}, f"{put}_sum": {math.inf: 0.020}}
    after = {put: {0.01: 14.0, math.inf: 15.0}, f"{put}_sum": {math.inf: 0.051}}
    got = waits(before, after)
    assert got["put_count"] == 10 and math.isclose(got["put_mean_ms"], 3.1)
    assert "put_mean_ms" not in waits({}, {put: after[put]})  # no sum exported: no mean


def test_scrape_reads_the_histograms_sums() -> None:
    """The sums are read off prometheus-client's exposition beside the buckets, served by
    its own HTTP server (127.0.0.1, a free port); another histogram's sum is left out."""
    from prometheus_client import CollectorRegistry, Histogram, start_http_server

    registry = CollectorRegistry()
    put = Histogram("kafscale_segment_put_duration_seconds", "x", buckets=[0.01],
                    registry=registry)  # fmt: skip
    other = Histogram("kafscale_other_seconds", "x", registry=registry)
    for took in (0.002, 0.003, 0.005, 0.49):
        put.observe(took)
    other.observe(9.0)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        got = scrape_buckets(f"http://127.0.0.1:{server.server_port}/metrics")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(30)
    name = "kafscale_segment_put_duration_seconds"
    assert got[name] == {0.01: 3.0, math.inf: 4.0}
    assert math.isclose(got[f"{name}_sum"][math.inf], 0.5)
    assert "kafscale_other_seconds_sum" not in got
    assert math.isclose(waits({}, got)["put_mean_ms"], 125.0)
