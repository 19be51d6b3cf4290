"""broker.request_metrics and broker.telemetry: what the connection hook records, in
which order, with bounded labels, exported through prometheus-client."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, cast

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker.handlers.registry import ApiHandler, Encoded
from broker.request_metrics import RequestRecorder, error_codes
from broker.telemetry import Telemetry
from protocol.apis import ApiKey
from protocol.codec import error_response
from protocol.errors import ErrorCode
from protocol.frame import RequestHeader
from protocol.produce_fast import ProducePartitionResult, ProduceTopicResult


async def _noop(_ctx: object, _req: object) -> None:
    return None


ROUTES = {
    ApiKey.PRODUCE: ApiHandler(ApiKey.PRODUCE, 3, 11, _noop),
    ApiKey.METADATA: ApiHandler(ApiKey.METADATA, 0, 12, _noop),
}


def _samples(t: Telemetry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(t)
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _hdr(key: int, version: int) -> RequestHeader:
    return RequestHeader(key, version, 1, "c", 10)


async def test_pipelined_requests_are_timed_in_order_and_deferred_waits_counted() -> None:
    t = Telemetry()
    rec = RequestRecorder(t, routes=cast(Mapping[int, Any], ROUTES))
    conn = rec.connection()
    conn.opened()
    conn.arrived(100)
    conn.arrived(2000)
    conn.started(_hdr(ApiKey.METADATA, 12))
    conn.started(_hdr(ApiKey.PRODUCE, 9))
    fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    task = asyncio.ensure_future(conn.deferred(fut))  # as the connection does
    conn.finished(error_response(ApiKey.METADATA, ErrorCode.NONE), [b"x" * 30])
    fut.set_result("answer")
    assert await task == "answer"
    topics = [
        ProduceTopicResult(
            "t",
            [
                ProducePartitionResult(0, 0),
                ProducePartitionResult(1, int(ErrorCode.NOT_LEADER_OR_FOLLOWER)),
            ],
        )
    ]
    conn.finished(Encoded([b"y" * 40], topics), [b"y" * 40])
    conn.closed()
    m = _samples(t)
    produce = (("api", "Produce"), ("version", "9"))
    metadata = (("api", "Metadata"), ("version", "12"))
    assert m[("kafscale_request_duration_seconds_count", produce)] == 1
    assert m[("kafscale_request_duration_seconds_count", metadata)] == 1
    assert m[("kafscale_request_commit_wait_seconds_count", produce)] == 1
    assert m[("kafscale_request_commit_wait_seconds_count", metadata)] == 0
    assert m[("kafscale_request_size_bytes_sum", (("api", "Produce"),))] == 2000
    assert m[("kafscale_response_size_bytes_sum", (("api", "Produce"),))] == 40
    assert m[("kafscale_responses_total", (("api", "Produce"), ("error", "NONE")))] == 1
    nl = (("api", "Produce"), ("error", "NOT_LEADER_OR_FOLLOWER"))
    assert m[("kafscale_responses_total", nl)] == 1
    assert m[("kafscale_listener_connections", (("listener", "plaintext"),))] == 0
    assert m[("kafscale_connections_opened_total", (("listener", "plaintext"),))] == 1
    inf = dict(produce) | {"le": "+Inf"}
    assert m[("kafscale_request_duration_seconds_bucket", tuple(sorted(inf.items())))] == 1


def test_made_up_keys_and_versions_share_one_label_set() -> None:
    t = Telemetry()
    rec = RequestRecorder(t, routes=cast(Mapping[int, Any], ROUTES))
    conn = rec.connection()
    for key, version in [(999, 0), (ApiKey.PRODUCE, 99), (5000, 7), (ApiKey.METADATA, 13)]:
        conn.arrived(10)
        conn.started(_hdr(key, version))
        conn.finished(None, None)
    m = _samples(t)
    counts = {k: v for k, v in m.items() if k[0] == "kafscale_request_duration_seconds_count"}
    assert counts == {
        ("kafscale_request_duration_seconds_count", (("api", "unknown"), ("version", "-1"))): 4
    }


def test_error_codes_walk_kafka_python_responses() -> None:
    resp = error_response(ApiKey.METADATA, ErrorCode.NONE)
    assert error_codes(resp) == [0]
    assert error_codes(Encoded([b""])) == []
    assert error_codes(None) == []


def test_histogram_buckets_are_cumulative_and_le_inclusive() -> None:
    t = Telemetry()
    h = t.histogram("x_seconds", "x", (), (0.1, 1.0)).child()
    for v in (0.1, 0.5, 1.0, 7.0):
        h.observe(v)
    m = _samples(t)
    assert m[("kafscale_x_seconds_bucket", (("le", "0.1"),))] == 1
    assert m[("kafscale_x_seconds_bucket", (("le", "1.0"),))] == 3
    assert m[("kafscale_x_seconds_bucket", (("le", "+Inf"),))] == 4
    assert m[("kafscale_x_seconds_count", ())] == 4
    assert m[("kafscale_x_seconds_sum", ())] == 8.6


async def test_produce_is_timed_again_in_fine_buckets_and_other_apis_are_not() -> None:
    """The bench's broker-side Produce p99 (docs/benchmarks.md, "Round 4: paced p99")
    needs finer buckets than the 5 / 10 / 25 ms of ``request_duration_seconds``."""
    t = Telemetry()
    rec = RequestRecorder(t, routes=cast(Mapping[int, Any], ROUTES))
    conn = rec.connection()
    for key, version in ((ApiKey.PRODUCE, 9), (ApiKey.METADATA, 12), (ApiKey.PRODUCE, 9)):
        conn.arrived(100 if key == ApiKey.PRODUCE else 7)
        conn.started(_hdr(key, version))
        fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(conn.deferred(fut))
        fut.set_result("answer")
        await task
        conn.finished(error_response(key, ErrorCode.NONE), [b"x" * 30])
    s = _samples(t)
    names = ("produce_request_duration_seconds", "produce_commit_wait_seconds")
    for name in names:
        assert s[(f"kafscale_{name}_count", ())] == 2
    for name in (*names, "produce_byte_duration_seconds"):
        bounds = {dict(lbl)["le"] for n, lbl in s if n == f"kafscale_{name}_bucket"}
        assert {"0.0015", "0.0065", "0.0125"} <= bounds  # finer than the default buckets
    total = ("kafscale_request_duration_seconds_count", (("api", "Produce"), ("version", "9")))
    assert s[total] == 2
    # once per byte of the two 100-byte Produce frames, none for the Metadata one
    assert s[("kafscale_produce_byte_duration_seconds_count", ())] == 200
