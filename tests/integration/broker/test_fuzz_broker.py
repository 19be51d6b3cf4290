"""Fuzz a running broker with random and mutated frames (hypothesis).

Each example is one frame (random bytes, or a valid ApiVersions / Metadata / Produce /
Fetch request with bytes flipped, cut, inserted or a length field rewritten), sent on a
fresh connection that is then half-closed; the broker answers, closes, or waits for more
bytes until our EOF. Afterwards the broker must still be up, its log must hold no
traceback, and a real produce + consume round trip (raw protocol and librdkafka) works.

Then corrupt record batches (issue 16): valid batches of 1-6 records in every codec,
mutated with bad CRCs, lying record counts and last offset deltas (CRC redone), lying
batch lengths, wrong magic, garbage in the compressed stream, lying maxTimestamp, each
produced to ``fuzz-batches``. Every batch the broker accepts is counted; afterwards the
partition's high watermark equals the accepted records, a raw fetch decodes every
offset 0..HW-1, librdkafka (confluent-kafka) consumes every one of them without an error
(the end-to-end half of the validator's property test), and the broker's RSS stayed
within bounds.
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

from protocol.batch import crc32c
from protocol.compression import Compression
from protocol.records import build_batch
from tests.fixtures.broker import BrokerProcess, free_port, start_broker
from tests.integration import kafka_raw as kr

pytestmark = pytest.mark.integration

MAX_REQUEST = 256 * 1024
FUZZ_TOPIC = "fuzz-target"
BATCH_TOPIC = "fuzz-batches"
RSS_BOUND_KIB = 150 * 1024  # growth over the fuzz run: far below any per-frame allocation
ACCEPTED: list[int] = []  # record counts of the batches the broker acknowledged


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
        b.env["RSS_BASE_KIB"] = str(_rss_kib(b.pid))
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


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _recrc(batch: bytearray) -> None:
    struct.pack_into(">I", batch, 17, crc32c(memoryview(batch)[21:]))


@st.composite
def corrupt_batches(draw: st.DrawFn) -> bytes:
    n = draw(st.integers(1, 6))
    recs = [
        (draw(st.none() | st.binary(max_size=8)), draw(st.binary(max_size=64)), None)
        for _ in range(n)
    ]
    codec = draw(st.sampled_from(list(Compression)))
    batch = bytearray(build_batch(recs, compression=codec))
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(
            st.sampled_from(["crc", "count", "delta", "both", "length", "magic", "body", "maxts"])
        )
        if kind == "crc":
            batch[draw(st.integers(21, len(batch) - 1))] ^= draw(st.integers(1, 255))
            continue  # the CRC is left wrong
        if kind == "count":
            struct.pack_into(">i", batch, 57, draw(st.integers(-1, 1 << 30)))
        elif kind == "delta":
            struct.pack_into(">i", batch, 23, draw(st.integers(-1, 1 << 30)))
        elif kind == "both":
            lie = draw(st.integers(0, 1 << 30))
            struct.pack_into(">i", batch, 23, lie)
            struct.pack_into(">i", batch, 57, lie + 1)
        elif kind == "length":
            struct.pack_into(">i", batch, 8, draw(st.integers(0, len(batch) + 100)))
        elif kind == "magic":
            batch[16] = draw(st.sampled_from([0, 1, 3, 0xFF]))
        elif kind == "body" and len(batch) > 61:
            pos = draw(st.integers(61, len(batch) - 1))
            batch[pos] ^= draw(st.integers(1, 255))
        elif kind == "maxts":
            struct.pack_into(">q", batch, 35, draw(st.sampled_from([-1, 0, 1 << 50])))
        _recrc(batch)
    return bytes(batch)


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=corrupt_batches())
def test_corrupt_batches_are_refused(fuzz_broker: BrokerProcess, batch: bytes) -> None:
    res = kr.produce_raw(fuzz_broker.port, BATCH_TOPIC, 0, batch)
    if res.error_code == 0:
        ACCEPTED.append(struct.unpack_from(">i", batch, 57)[0])
    else:
        assert res.base_offset == -1
        assert res.error_code in (2, 87, 76, 32), res  # CORRUPT, INVALID_RECORD, codec, ts


def test_accepted_batches_are_all_readable(fuzz_broker: BrokerProcess) -> None:
    """Runs after the corrupt-batch fuzz (file order)."""
    total = sum(ACCEPTED)
    assert len(ACCEPTED) > 10  # the generator also produces plenty of good batches
    got = kr.fetch_all(fuzz_broker.port, BATCH_TOPIC, 0)
    assert got.error_code == 0
    assert got.high_watermark == total
    assert [o for o, _, _ in got.records] == list(range(total))
    c = Consumer(
        {
            "bootstrap.servers": fuzz_broker.bootstrap,
            "group.id": "fz-batches",
            "enable.auto.commit": False,
            "check.crcs": True,
        }
    )
    try:
        c.assign([TopicPartition(BATCH_TOPIC, 0, 0)])
        offsets: list[int] = []
        errors: list[str] = []
        deadline = time.monotonic() + 30
        while len(offsets) < total and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                errors.append(str(m.error()))
                continue
            offsets.append(int(m.offset() or 0))
        assert errors == []
        assert offsets == list(range(total))
    finally:
        c.close()
    grown = _rss_kib(fuzz_broker.pid) - int(fuzz_broker.env["RSS_BASE_KIB"])
    print(f"fuzz: {len(ACCEPTED)} batches / {total} records accepted; RSS grew {grown} KiB")
    assert grown < RSS_BOUND_KIB
