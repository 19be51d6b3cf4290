"""A tiny raw Kafka client over blocking sockets, for tests that send hand-made frames.

Requests are built with kafka-python's ``kafka.protocol`` classes (or by hand, for
malformed input) and responses decoded with the same classes. ``produce_raw`` and
``fetch_records`` give tests a real produce/consume round trip at the wire level without
any client library logic in between.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from protocol.batch import iter_batches
from protocol.records import decode_batch

TIMEOUT = 10.0


def frame(payload: bytes) -> bytes:
    """``payload`` with its int32 size prefix."""
    return struct.pack(">i", len(payload)) + payload


def request_bytes(req: Any, version: int, correlation_id: int = 1, client_id: str = "raw") -> bytes:
    """A whole framed request (size + header + body) encoded by kafka-python."""
    req.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(req.encode(version=version, header=True, framed=True))


def header_v1(api_key: int, version: int, correlation_id: int, client_id: str = "raw") -> bytes:
    """A non-flexible request header (v1) written by hand."""
    cid = client_id.encode()
    return struct.pack(">hhih", api_key, version, correlation_id, len(cid)) + cid


class RawConn:
    """One blocking TCP connection to a broker."""

    def __init__(self, port: int, timeout: float = TIMEOUT) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)

    def __enter__(self) -> RawConn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _recv_exact(self, n: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)

    def recv_frame(self) -> bytes | None:
        """The next response frame without its size prefix; None when the peer closed."""
        head = self._recv_exact(4)
        if head is None:
            return None
        (size,) = struct.unpack(">i", head)
        return self._recv_exact(size)

    def closed_by_peer(self) -> bool:
        """True when the broker closes the connection (EOF or reset) within the timeout."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    def call(self, req: Any, resp_cls: Any, version: int, correlation_id: int = 1) -> Any:
        self.send(request_bytes(req, version, correlation_id))
        data = self.recv_frame()
        assert data is not None, "broker closed the connection instead of answering"
        (cid,) = struct.unpack_from(">i", data)
        assert cid == correlation_id
        return resp_cls.decode(data, version=version, header=True)


def api_versions(port: int, version: int = 3) -> Any:
    with RawConn(port) as c:
        req = ApiVersionsRequest(client_software_name="raw", client_software_version="1")
        return c.call(req, ApiVersionsResponse, version)


def metadata(port: int, topics: Sequence[str] | None, version: int = 9) -> Any:
    with RawConn(port) as c:
        req = MetadataRequest(
            topics=None
            if topics is None
            else [(t,) if version < 10 else (None, t) for t in topics],
            allow_auto_topic_creation=True,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
        return c.call(req, MetadataResponse, version)


@dataclass(frozen=True, slots=True)
class ProduceResult:
    error_code: int
    base_offset: int
    error_message: str | None


def produce_request(
    topic: str, partition: int, records: bytes, acks: int = -1, timeout_ms: int = 10000
) -> Any:
    return ProduceRequest(
        transactional_id=None,
        acks=acks,
        timeout_ms=timeout_ms,
        topic_data=[(topic, [(partition, records)])],
    )


def produce_raw(
    port: int, topic: str, partition: int, records: bytes, *, acks: int = -1, version: int = 8
) -> ProduceResult:
    """Send one Produce with ``records`` as the partition's record set; return its result."""
    with RawConn(port) as c:
        resp = c.call(produce_request(topic, partition, records, acks), ProduceResponse, version)
    (t,) = resp.responses
    (p,) = t.partition_responses
    msg = p.error_message if version >= 8 else None
    return ProduceResult(p.error_code, p.base_offset, msg)


@dataclass(frozen=True, slots=True)
class Fetched:
    error_code: int
    high_watermark: int
    records: list[tuple[int, bytes | None, bytes | None]]  # (offset, key, value)


def fetch_request(topics: list[Any], *, max_bytes: int = 4 << 20, isolation_level: int = 0) -> Any:
    """A consumer's Fetch of ``topics`` (kafka-python's topic entries or tuples) without a
    wait or a session."""
    return FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=0,
        max_bytes=max_bytes,
        isolation_level=isolation_level,
        session_id=0,
        session_epoch=-1,
        topics=topics,
        forgotten_topics_data=[],
        rack_id="",
    )


def fetch_records(
    port: int, topic: str, partition: int, offset: int = 0, max_bytes: int = 4 << 20
) -> Fetched:
    """One Fetch v11 from ``offset`` (no wait); every record of the returned batches."""
    req = fetch_request([(topic, [(partition, -1, offset, -1, max_bytes)])], max_bytes=max_bytes)
    with RawConn(port) as c:
        resp = c.call(req, FetchResponse, 11)
    (t,) = resp.responses
    (p,) = t.partitions
    out: list[tuple[int, bytes | None, bytes | None]] = []
    data = memoryview(bytes(p.records or b""))
    for _hdr, view in iter_batches(data):
        _h, recs = decode_batch(view)
        for r in recs:
            if r.offset >= offset:
                out.append((r.offset, r.key, r.value))
    return Fetched(p.error_code, p.high_watermark, out)


def fetch_all(port: int, topic: str, partition: int) -> Fetched:
    """Every record from offset 0 up to the high watermark (several fetches if needed)."""
    first = fetch_records(port, topic, partition, 0)
    records = list(first.records)
    hw = first.high_watermark
    while first.error_code == 0 and records and records[-1][0] + 1 < hw:
        first = fetch_records(port, topic, partition, records[-1][0] + 1)
        if not first.records:
            break
        records.extend(first.records)
    return Fetched(first.error_code, hw, records)


def metrics(http_port: int) -> dict[str, float]:
    """The broker's Prometheus gauges and counters (``--http``), by name."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.partition(" ")
            out[name] = float(value)
    return out


def wait_idle(http_port: int, timeout: float = 10.0) -> dict[str, float]:
    """Wait until the broker has no Kafka connection and no unanswered bytes; the gauges."""
    import time

    deadline = time.monotonic() + timeout
    m = metrics(http_port)
    while time.monotonic() < deadline:  # polling another process's gauges
        if m["kafscale_connections"] == 0 and m["kafscale_inflight_bytes"] == 0:
            break
        time.sleep(0.05)
        m = metrics(http_port)
    return m
