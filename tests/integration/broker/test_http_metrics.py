"""``--http``: /healthz, /readyz and /metrics of a real broker process, scraped over HTTP
and parsed with prometheus-client's parser."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.broker import BrokerProcess, free_port, start_broker

pytestmark = pytest.mark.integration

TOPIC = "metrics-demo"
MESSAGES = 4


@pytest.fixture
def http_broker(tmp_path: Path) -> Iterator[tuple[BrokerProcess, int]]:
    """A broker that merges every run of 2+ segments at once and deletes the merged-away
    objects without a grace period, so the maintenance counters move."""
    http = free_port()
    b = start_broker(
        tmp_path,
        extra_args=(
            "--http", f"127.0.0.1:{http}",
            "--merge-interval-ms", "100",
            "--merge-min-segments", "2",
            "--merge-min-age-ms", "0",
            "--segment-delete-grace-ms", "0",
        ),
    )  # fmt: skip
    try:
        yield b, http
    finally:
        b.stop()


def _get(url: str, accept: str | None = None) -> tuple[int, str, str]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def _scrape(http: int) -> dict[str, tuple[str, str, float]]:
    """name -> (type, HELP, value), parsed by prometheus_client.parser."""
    status, content_type, text = _get(f"http://127.0.0.1:{http}/metrics")
    assert status == 200 and content_type.startswith("text/plain"), content_type
    out: dict[str, tuple[str, str, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name] = (fam.type, fam.documentation, s.value)
    return out


def _produce_one_segment_each(bootstrap: str) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    for i in range(MESSAGES):
        p.produce(TOPIC, key=b"k%d" % i, value=b"v%d" % i, partition=0)
        assert p.flush(30) == 0  # acknowledged: committed as a segment of its own


def test_probes_and_unknown_paths(http_broker: tuple[BrokerProcess, int]) -> None:
    _b, http = http_broker
    assert _get(f"http://127.0.0.1:{http}/healthz")[::2] == (200, "ok\n")
    assert _get(f"http://127.0.0.1:{http}/readyz")[::2] == (200, "ready\n")
    assert _get(f"http://127.0.0.1:{http}/nope")[0] == 404


def test_metrics_scrape(http_broker: tuple[BrokerProcess, int]) -> None:
    b, http = http_broker
    before = _scrape(http)
    assert before["kafscale_live_brokers"][2] == 1
    assert before["kafscale_topics"][2] == 0
    assert before["kafscale_segments_total"][2] == 0
    for name, (kind, help_, _v) in before.items():
        assert help_ and help_ != name, f"{name} has no HELP"
        if kind == "histogram":
            assert name.endswith(("_bucket", "_sum", "_count", "_created")), name
            continue
        assert kind == ("counter" if name.endswith("_total") else "gauge"), name

    _produce_one_segment_each(b.bootstrap)
    m = _scrape(http)
    assert m["kafscale_topics"][2] == 1 and m["kafscale_partitions_owned"][2] == 1
    assert m["kafscale_segments_total"][2] >= MESSAGES
    assert m["kafscale_txns_total"][2] >= MESSAGES
    assert m["kafscale_flush_cycles_total"][2] >= MESSAGES
    assert m["kafscale_segment_bytes_total"][2] > 0
    assert m["kafscale_pending_bytes"][2] == 0  # every message was acknowledged

    deadline = time.monotonic() + 60  # waiting for the maintenance loop, not timing it
    while time.monotonic() < deadline:
        m = _scrape(http)
        if m["kafscale_maintenance_deleted_objects_total"][2] > 0:
            break
        time.sleep(0.2)
    assert m["kafscale_maintenance_merges_total"][2] >= 1, m
    assert m["kafscale_maintenance_merged_segments_total"][2] >= 2, m
    assert m["kafscale_maintenance_merged_bytes_total"][2] > 0, m
    assert m["kafscale_maintenance_deleted_objects_total"][2] >= 1, m
    assert m["kafscale_maintenance_dropped_segments_total"][2] == 0, m
    assert "Traceback" not in b.log_text()


def test_openmetrics_on_request(http_broker: tuple[BrokerProcess, int]) -> None:
    _b, http = http_broker
    status, content_type, text = _get(
        f"http://127.0.0.1:{http}/metrics", accept="application/openmetrics-text; version=1.0.0"
    )
    assert status == 200 and content_type.startswith("application/openmetrics-text")
    assert text.endswith("# EOF\n")
    names = {s.name for fam in text_string_to_metric_families(_get(
        f"http://127.0.0.1:{http}/metrics")[2]) for s in fam.samples}  # fmt: skip
    assert "kafscale_maintenance_merges_total" in names
    assert "# HELP kafscale_maintenance_merges " in text
