"""Fuzz a running broker with random and mutated frames (hypothesis).

Each example is one frame (random bytes, or a valid ApiVersions / Metadata / Produce /
Fetch request with bytes flipped, cut, inserted or a length field rewritten), sent on a
fresh connection that is then half-closed; the broker answers, closes, or waits for more
bytes until our EOF. Afterwards the broker must still be up, its log must hold no
traceback, and a real produce + consume round trip (raw protocol and librdkafka) works.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest

from protocol.records import build_batch
from tests.fixtures.broker import BrokerProcess, free_port, start_broker
from tests.integration import kafka_raw as kr

pytestmark = pytest.mark.integration

MAX_REQUEST = 256 * 1024
FUZZ_TOPIC = "fuzz-target"


def _seeds() -> list[bytes]:
    batch = build_batch([(b"key", b"value" * 10, [("h", b"1")])] * 3)
    return [
        kr.request_bytes(
            ApiVersionsRequest(client_software_name="fz", client_software_version="1"), 3
        )[4:],
        kr.request_bytes(ApiVersionsRequest(), 0)[4:],
        kr.request_bytes(MetadataRequest(topics=[(FUZZ_TOPIC,)]), 4)[4:],
        kr.request_bytes(kr.produce_request(FUZZ_TOPIC, 0, batch), 8)[4:],
        kr.request_bytes(kr.produce_request(FUZZ_TOPIC, 0, batch), 9)[4:],
        kr.request_bytes(kr.produce_request(FUZZ_TOPIC, 0, batch, acks=0), 3)[4:],
    ]


SEEDS = _seeds()


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "int32", "int16"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[pos] ^= draw(st.integers(1, 255))
        elif kind == "cut":
            del data[pos : pos + draw(st.integers(1, 64))]
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "int32" and pos + 4 <= len(data):
            value = draw(st.sampled_from([-1, 0, 1, 0x7FFFFFFF, -0x80000000, 1 << 20, 61]))
            struct.pack_into(">i", data, pos, value)
        elif kind == "int16" and pos + 2 <= len(data):
            struct.pack_into(">h", data, pos, draw(st.sampled_from([-1, 0, 18, 0x7FFF, -2])))
    return bytes(data)


frames = st.one_of(
    st.binary(min_size=0, max_size=200).map(kr.frame),
    st.binary(min_size=0, max_size=64),  # no valid size prefix at all
    mutated().map(kr.frame),
    mutated(),  # a mutated request without its size prefix
)


def _throw(port: int, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):  # drain until the broker closes
                pass
        except (ConnectionResetError, BrokenPipeError, TimeoutError):
            pass


@pytest.fixture(scope="module")
def fuzz_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    http = free_port()
    b = start_broker(
        tmp_path_factory.mktemp("fuzz"),
        extra_args=("--max-request-bytes", str(MAX_REQUEST), "--http", f"127.0.0.1:{http}"),
    )
    b.env["HTTP_PORT"] = str(http)
    try:
        res = kr.produce_raw(b.port, FUZZ_TOPIC, 0, build_batch([(b"seed", b"first", None)]))
        assert res.error_code == 0 and res.base_offset == 0
        yield b
    finally:
        b.stop()


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=frames)
def test_random_frames_do_not_hurt_the_broker(fuzz_broker: BrokerProcess, data: bytes) -> None:
    _throw(fuzz_broker.port, data)
    assert fuzz_broker.proc is not None and fuzz_broker.proc.poll() is None


def test_broker_serves_after_fuzzing(fuzz_broker: BrokerProcess) -> None:
    """Runs after the fuzz test (file order): the broker still works end to end."""
    log = fuzz_broker.log_text()
    assert "Traceback" not in log
    gauges = kr.wait_idle(int(fuzz_broker.env["HTTP_PORT"]))
    assert gauges["kafscale_connections"] == 0 and gauges["kafscale_inflight_bytes"] == 0
    got = kr.fetch_all(fuzz_broker.port, FUZZ_TOPIC, 0)
    assert got.error_code == 0
    assert got.records[0] == (0, b"seed", b"first")
    offsets = [o for o, _, _ in got.records]
    assert offsets == list(range(len(offsets))) and len(offsets) == got.high_watermark
    topic = "after-fuzz"
    p = Producer({"bootstrap.servers": fuzz_broker.bootstrap, "acks": "all"})
    for i in range(10):
        p.produce(topic, value=b"m%d" % i)
    assert p.flush(15) == 0
    c = Consumer({"bootstrap.servers": fuzz_broker.bootstrap, "group.id": "fz"})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        seen: list[bytes] = []
        deadline = time.monotonic() + 15
        while len(seen) < 10 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                seen.append(m.value() or b"")
        assert seen == [b"m%d" % i for i in range(10)]
    finally:
        c.close()
