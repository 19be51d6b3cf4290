"""Issue 11: ``/metrics`` of a real broker process under real client load (confluent-kafka),
parsed with ``prometheus_client.parser``; the Grafana dashboard's queries checked against
what the broker exports; ``/healthz`` and ``/readyz``; ``--log-format json``.

One broker per backend (``--lease-ttl 3`` so that the keep-alive wakes every second)
serves the module; the load is produced once (module fixture) and the tests read it. The liveness
test freezes a broker of its own.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.broker import BrokerProcess, free_port, start_broker
from tests.integration.conftest import BACKENDS, backend_kwargs

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
DASHBOARD = REPO / "deploy" / "grafana" / "kafscale.json"
TOPIC = "obs-orders"
GROUP = "obs-stopped"
PARTITIONS = 2
FIRST, SECOND = 40, 25  # records produced before and after the group stops consuming

Labels = tuple[tuple[str, str], ...]


@dataclass
class Scrape:
    types: dict[str, str]  # family name -> type
    samples: dict[tuple[str, Labels], float]  # (sample name, sorted labels) -> value
    family_of: dict[str, str]  # sample name -> family name

    def value(self, name: str, **labels: str) -> float:
        return self.samples[(name, tuple(sorted(labels.items())))]

    def matching(self, name: str, **labels: str) -> dict[Labels, float]:
        want = set(labels.items())
        return {lab: v for (n, lab), v in self.samples.items() if n == name and want <= set(lab)}

    def names(self) -> set[str]:
        return set(self.types) | set(self.family_of)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=20) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(http: int) -> Scrape:
    status, text = _get(f"http://127.0.0.1:{http}/metrics")
    assert status == 200, text
    types: dict[str, str] = {}
    samples: dict[tuple[str, Labels], float] = {}
    family_of: dict[str, str] = {}
    for fam in text_string_to_metric_families(text):
        types[fam.name] = fam.type
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
            family_of[s.name] = fam.name
    return Scrape(types, samples, family_of)


@dataclass
class Loaded:
    broker: BrokerProcess
    http: int
    before: Scrape  # scraped after the first load, before the second
    committed: dict[int, int]  # partition -> offset the group committed


def _produce(bootstrap: str, n: int, start: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(start, start + n):
        p.produce(TOPIC, key=b"k%d" % i, value=b"order-%d" % i, partition=i % PARTITIONS)
    assert p.flush(60) == 0


def _consume_and_stop(bootstrap: str, want: int) -> dict[int, int]:
    """Consume ``want`` records in GROUP, commit them, close (the group stops)."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": GROUP,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        c.subscribe([TOPIC])
        got = 0
        deadline = time.monotonic() + 90
        while got < want and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is not None and m.error() is None:
                got += 1
        assert got == want, got
        c.commit(asynchronous=False)
        parts = c.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=30)
        return {tp.partition: tp.offset for tp in parts}
    finally:
        c.close()


@pytest.fixture(scope="module", params=BACKENDS)
def loaded(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Loaded]:
    """The loaded broker on each backend: local, then SeaweedFS S3 + etcd (whose store and
    metadata latencies are the ones the dashboard's S3 and etcd panels show)."""
    http = free_port()
    kw = backend_kwargs(request, request.param)
    b = start_broker(
        tmp_path_factory.mktemp("obs"),
        store_url=kw.get("store_url"),
        meta_url=kw.get("meta_url"),
        extra_args=(
            "--http", f"127.0.0.1:{http}",
            "--lease-ttl", "3",
            "--default-partitions", str(PARTITIONS),
            "--log-format", "json",
            *kw.get("extra_args", ()),
        ),
    )  # fmt: skip
    try:
        _produce(b.bootstrap, FIRST, 0)
        committed = _consume_and_stop(b.bootstrap, FIRST)
        before = scrape(http)
        _produce(b.bootstrap, SECOND, FIRST)  # the group has stopped: its lag grows
        yield Loaded(b, http, before, committed)
    finally:
        b.stop()


def test_request_histograms_are_populated_for_the_apis_used(loaded: Loaded) -> None:
    m = scrape(loaded.http)
    for api in ("ApiVersions", "Metadata", "Produce", "Fetch", "JoinGroup", "OffsetCommit"):
        counts = m.matching("kafscale_request_duration_seconds_count", api=api)
        assert counts and sum(counts.values()) > 0, (api, counts)
        queued = m.matching("kafscale_request_queue_seconds_count", api=api)
        assert sum(queued.values()) >= sum(counts.values()), api  # some never answered
        assert sum(m.matching("kafscale_request_size_bytes_sum", api=api).values()) > 0, api
        assert sum(m.matching("kafscale_response_size_bytes_sum", api=api).values()) > 0, api
    # every acks=all produce waited on its commit; the buckets are cumulative up to +Inf
    produce = m.matching("kafscale_request_duration_seconds_count", api="Produce")
    waits = m.matching("kafscale_request_commit_wait_seconds_count", api="Produce")
    assert sum(waits.values()) == sum(produce.values()) > 0
    for labels, count in produce.items():
        inf = dict(labels) | {"le": "+Inf"}
        assert m.value("kafscale_request_duration_seconds_bucket", **inf) == count
    ok = m.matching("kafscale_responses_total", api="Produce", error="NONE")
    assert sum(ok.values()) >= sum(produce.values())
    assert m.value("kafscale_listener_connections", listener="plaintext") >= 0


def test_write_read_and_ownership_metrics(loaded: Loaded) -> None:
    m = scrape(loaded.http)
    total = FIRST + SECOND
    assert m.value("kafscale_topic_records_in_total", topic=TOPIC) == total
    assert m.value("kafscale_topic_bytes_in_total", topic=TOPIC) > 0
    assert m.value("kafscale_topic_records_out_total", topic=TOPIC) >= FIRST
    assert m.value("kafscale_batch_records_sum") == total
    assert m.value("kafscale_segment_records_sum") == total
    assert m.value("kafscale_flush_cycle_duration_seconds_count") >= 1
    assert m.value("kafscale_store_request_duration_seconds_count", op="put") >= 2
    assert m.value("kafscale_store_bytes_total", op="put") > 0
    assert m.value("kafscale_meta_request_duration_seconds_count", op="txn") >= 2
    assert m.value("kafscale_ownership_acquisitions_total") == PARTITIONS
    assert m.value("kafscale_partitions_owned") == PARTITIONS
    assert m.value("kafscale_fetch_long_poll_wait_seconds_count") >= 1
    deadline = time.monotonic() + 30  # the keep-alive wakes every second (--lease-ttl 3)
    while m.value("kafscale_lease_keepalive_delay_seconds_count") < 2:
        assert time.monotonic() < deadline, "no keep-alive observed"
        time.sleep(0.5)
        m = scrape(loaded.http)


def test_lag_of_a_group_that_stopped_consuming(loaded: Loaded) -> None:
    """Lag = log end (the high watermark a client sees) - the committed offset."""
    c = Consumer({"bootstrap.servers": loaded.broker.bootstrap, "group.id": "obs-probe"})
    try:
        ends = {
            p: c.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=30)[1]
            for p in range(PARTITIONS)
        }
    finally:
        c.close()
    assert sum(ends.values()) == FIRST + SECOND
    m = scrape(loaded.http)
    for p in range(PARTITIONS):
        labels = {"group": GROUP, "topic": TOPIC, "partition": str(p)}
        assert m.value("kafscale_group_committed_offset", **labels) == loaded.committed[p]
        lag = m.value("kafscale_group_lag", **labels)
        assert lag == ends[p] - loaded.committed[p] > 0, (p, lag, ends, loaded.committed)
    assert m.value("kafscale_group_members", group=GROUP) == 0
    assert m.value("kafscale_group_state", group=GROUP, state="Empty") == 1
    assert m.value("kafscale_group_rebalances_total", group=GROUP) >= 1
    assert m.value("kafscale_group_lag_partitions_omitted") == 0


def test_counters_are_monotonic_across_scrapes(loaded: Loaded) -> None:
    first = loaded.before
    _bad_input(loaded.broker.port)
    second = scrape(loaded.http)
    checked = 0
    for (name, labels), v1 in first.samples.items():
        kind = first.types[first.family_of[name]]
        if kind == "counter" or (kind == "histogram" and not name.endswith("_created")):
            v2 = second.samples.get((name, labels))
            assert v2 is not None, (name, labels)
            assert v2 >= v1, (name, labels, v1, v2)
            checked += 1
    assert checked > 100
    assert second.value("kafscale_connections_closed_bad_input_total", listener="plaintext") > (
        first.value("kafscale_connections_closed_bad_input_total", listener="plaintext")
    )


def _bad_input(port: int) -> None:
    """A frame with a negative length: the broker closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(struct.pack(">i", -5))
        s.settimeout(10)
        assert s.recv(1) == b""


PROMQL_WORDS = {
    "sum", "max", "min", "avg", "count", "by", "without", "rate", "irate", "increase",
    "histogram_quantile", "clamp_min", "time", "topk", "le", "and", "or", "unless", "offset",
}  # fmt: skip


def dashboard_metric_names() -> set[str]:
    """Every metric name the dashboard's PromQL expressions use."""
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 20
    names: set[str] = set()
    for expr in exprs:
        bare = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
        bare = re.sub(r"\[[^\]]*\]", "", bare)  # range selectors
        bare = re.sub(r"\b(by|without)\s*\([^)]*\)", "", bare)  # grouping labels
        for tok in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare):
            if tok not in PROMQL_WORDS and not re.fullmatch(r"\d+[smhd]|e", tok):
                names.add(tok)
    return names


def test_dashboard_queries_name_only_exported_metrics(loaded: Loaded) -> None:
    from ingest_job.report import EXPORTED as INGEST_EXPORTED

    exported = scrape(loaded.http).names() | set(INGEST_EXPORTED)
    used = dashboard_metric_names()
    assert "kafscale_request_duration_seconds_bucket" in used
    unknown = sorted(n for n in used if n not in exported)
    assert not unknown, unknown
    assert {n for n in used if n.startswith("kafscale_ingest_")} <= set(INGEST_EXPORTED)


def test_probes_and_json_logs(loaded: Loaded) -> None:
    assert _get(f"http://127.0.0.1:{loaded.http}/healthz") == (200, "ok\n")
    assert _get(f"http://127.0.0.1:{loaded.http}/readyz") == (200, "ready\n")
    lines = [ln for ln in loaded.broker.log_text().splitlines() if ln.strip()]
    records = [json.loads(ln) for ln in lines]  # every line is one JSON object
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    assert any(r["logger"] == "broker.server" and "serving" in r["message"] for r in records)
    assert not [r for r in records if "exc" in r]


def test_liveness_fails_after_the_event_loop_was_starved(tmp_path: Path) -> None:
    """A broker frozen (SIGSTOP) for 16 s, longer than its keep-alive interval (10 s, from
    --lease-ttl 30) plus the 5 s liveness bound, wakes with its keep-alive at least 6 s
    late: /healthz answers 503 naming it until the next keep-alive on schedule, then 200."""
    http = free_port()
    b = start_broker(tmp_path, extra_args=("--http", f"127.0.0.1:{http}", "--lease-ttl", "30"))
    try:
        url = f"http://127.0.0.1:{http}"
        deadline = time.monotonic() + 60
        while _get(f"{url}/readyz")[0] != 200:
            assert time.monotonic() < deadline, "never ready"
            time.sleep(0.2)
        assert _get(f"{url}/healthz") == (200, "ok\n")
        os.kill(b.pid, signal.SIGSTOP)
        time.sleep(16)  # the fault: no event loop for 16 s
        os.kill(b.pid, signal.SIGCONT)
        unhealthy = ""
        status, text = 0, ""
        deadline = time.monotonic() + 90  # the 503 lasts until the next keep-alive (~10 s)
        while time.monotonic() < deadline:
            status, text = _get(f"{url}/healthz")
            if status == 503 and not unhealthy:
                unhealthy = text
            if status == 200 and unhealthy:
                break
            time.sleep(0.2)
        assert "keep-alive woke" in unhealthy, (status, text)
        assert (status, text) == (200, "ok\n")
        m = scrape(http)
        assert m.value("kafscale_lease_keepalive_delay_seconds_sum") >= 6
    finally:
        os.kill(b.pid, signal.SIGCONT)
        b.stop()
