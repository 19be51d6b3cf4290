"""broker.connection.Connection driven through a fake transport (no socket): framing across
arbitrary chunk boundaries, pipelined requests answered in order, admission control
pausing and resuming reads, oversized frames, and a peer that hangs up mid-request.

The broker behind it is a real in-process one (embedded metadata, local store); only the
transport is a stand-in, as in uvicorn's protocol tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    MetadataRequest,
    MetadataResponse,
)

from broker.connection import Connection
from broker.meta.base import MetaStoreError
from broker.server import Broker
from protocol.apis import ApiKey
from tests.fixtures.inprocess import local_config

WAIT = 30.0


class FakeTransport(asyncio.Transport):
    """Records what the protocol writes and whether it reads; close() tells the protocol."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.reading = True
        self.closed = False
        self.protocol: Connection | None = None
        self.changed = asyncio.Event()

    def write(self, data: Any) -> None:
        self.written += bytes(data)
        self.changed.set()

    def pause_reading(self) -> None:
        self.reading = False
        self.changed.set()

    def resume_reading(self) -> None:
        self.reading = True
        self.changed.set()

    def is_reading(self) -> bool:
        return self.reading

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.changed.set()
            if self.protocol is not None:
                asyncio.get_running_loop().call_soon(self._lost, self.protocol)

    def _lost(self, protocol: Connection) -> None:
        protocol.connection_lost(None)
        self.changed.set()

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000)}.get(name, default)

    def get_write_buffer_size(self) -> int:
        return 0


async def until(transport: FakeTransport, cond: Any) -> None:
    async with asyncio.timeout(WAIT):
        while not cond():
            transport.changed.clear()
            await transport.changed.wait()


def feed(conn: Connection, data: bytes, chunk: int) -> None:
    """Deliver ``data`` to the protocol ``chunk`` bytes at a time, as a socket would."""
    pos = 0
    while pos < len(data):
        buf = conn.get_buffer(len(data) - pos)
        n = min(chunk, len(buf), len(data) - pos)
        buf[:n] = data[pos : pos + n]
        conn.buffer_updated(n)
        pos += n


def responses(transport: FakeTransport) -> list[bytes]:
    out, data = [], bytes(transport.written)
    while len(data) >= 4:
        (size,) = struct.unpack(">i", data[:4])
        if len(data) < 4 + size:
            break
        out.append(data[4 : 4 + size])
        data = data[4 + size :]
    return out


def request(req: Any, version: int, correlation_id: int) -> bytes:
    req.with_header(correlation_id=correlation_id, client_id="fake")
    return bytes(req.encode(header=True, framed=True))


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    # one request of more than 64 bytes pauses reading
    cfg = local_config(tmp_path, connection_inflight_bytes=64)
    b = Broker(cfg)
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


def connect(broker: Broker) -> tuple[Connection, FakeTransport]:
    conn, transport = Connection(broker), FakeTransport()
    transport.protocol = conn
    conn.connection_made(transport)
    return conn, transport


@pytest.mark.parametrize("chunk", [1, 3, 7, 1 << 20])
async def test_frames_split_anywhere_are_answered_in_order(broker: Broker, chunk: int) -> None:
    conn, transport = connect(broker)
    try:
        data = b"".join(request(ApiVersionsRequest[3](), 3, cid) for cid in (11, 12, 13))
        feed(conn, data, chunk)
        await until(transport, lambda: len(responses(transport)) == 3)
        got = [ApiVersionsResponse.decode(r, version=3, header=True) for r in responses(transport)]
        assert [r.header.correlation_id for r in got] == [11, 12, 13]
        keys = {k.api_key for k in got[0].api_keys}
        assert {ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.API_VERSIONS} <= keys
        assert got[0].api_keys == got[2].api_keys  # the route table, every time
    finally:
        transport.close()


async def test_admission_pauses_reading_until_answers_go_out(broker: Broker) -> None:
    """A request bigger than --connection-inflight-bytes stops the reads; they resume when
    its answer is written, and the broker-wide count returns to zero."""
    conn, transport = connect(broker)
    try:
        req = MetadataRequest[9](topics=[(f"topic-{i}", []) for i in range(8)])
        req.allow_auto_topic_creation = False
        data = request(req, 9, 5)
        assert len(data) > broker.config.connection_inflight_bytes
        feed(conn, data, 1 << 20)
        await until(transport, lambda: len(responses(transport)) == 1 and transport.reading)
        resp = MetadataResponse[9].decode(responses(transport)[0], header=True)
        assert resp.header.correlation_id == 5
        assert broker.admission.inflight == 0 and conn.inflight == 0
    finally:
        transport.close()


async def test_admission_pause_observed_while_the_request_is_pending(broker: Broker) -> None:
    conn, transport = connect(broker)
    gate = asyncio.Event()
    real = broker.routes[int(ApiKey.API_VERSIONS)]

    async def held(ctx: Any, req: Any) -> Any:
        await gate.wait()
        return await real.handle(ctx, req)

    broker.routes[int(ApiKey.API_VERSIONS)] = replace(real, handle=held)
    try:
        data = request(ApiVersionsRequest[3](client_software_name="x" * 80), 3, 1)
        assert len(data) - 4 > broker.config.connection_inflight_bytes
        feed(conn, data, 1 << 20)
        await until(transport, lambda: not transport.reading)  # over the limit: paused
        assert broker.admission.inflight == len(data) - 4
        gate.set()
        await until(transport, lambda: transport.reading and len(responses(transport)) == 1)
        assert broker.admission.inflight == 0
    finally:
        broker.routes[int(ApiKey.API_VERSIONS)] = real
        transport.close()


async def test_a_frame_over_the_limit_closes_at_its_length(broker: Broker) -> None:
    conn, transport = connect(broker)
    feed(conn, struct.pack(">i", broker.config.max_request_bytes + 1), 4)
    await until(transport, lambda: transport.closed)
    assert not responses(transport) and broker.admission.frame_bytes == 0
    await until(transport, lambda: conn not in broker.connections)


async def test_peer_hangs_up_mid_frame_and_nothing_is_left_behind(broker: Broker) -> None:
    conn, transport = connect(broker)
    data = request(ApiVersionsRequest[3](), 3, 9)
    feed(conn, data[: len(data) // 2], 1 << 20)
    conn.connection_lost(None)
    transport.closed = True
    await asyncio.sleep(0)  # let the connection's tasks see the cancellation
    assert conn not in broker.connections
    assert broker.admission.inflight == 0 and broker.admission.frame_bytes == 0


@contextlib.asynccontextmanager
async def deferred_answers(
    broker: Broker, before: Callable[[int], Awaitable[None]], last: int
) -> AsyncIterator[asyncio.Event]:
    """ApiVersions answered late: each answer awaits ``before(correlation_id)`` first;
    the event yielded is set once the request numbered ``last`` was handled (every
    answer up to it queued)."""
    arrived = asyncio.Event()
    real = broker.routes[int(ApiKey.API_VERSIONS)]

    async def deferred(ctx: Any, req: Any) -> Any:
        async def answer() -> Any:
            await before(ctx.header.correlation_id)
            return await real.handle(ctx, req)

        if ctx.header.correlation_id == last:
            arrived.set()
        return answer()

    broker.routes[int(ApiKey.API_VERSIONS)] = replace(real, handle=deferred)
    try:
        yield arrived
    finally:
        broker.routes[int(ApiKey.API_VERSIONS)] = real


def api_versions(*cids: int) -> bytes:
    return b"".join(request(ApiVersionsRequest[3](), 3, c) for c in cids)


def correlation_ids(transport: FakeTransport) -> list[int]:
    got = [ApiVersionsResponse.decode(r, version=3, header=True) for r in responses(transport)]
    return [r.header.correlation_id for r in got]


async def test_answers_ready_together_go_out_in_one_write(broker: Broker) -> None:
    """Deferred answers that complete together (the produces one flush cycle
    acknowledges) are written in one send, still in request order; an answer that is
    not ready yet is not waited for by the ones before it."""
    conn, transport = connect(broker)
    writes: list[bytes] = []
    record = transport.write

    def counted(data: Any) -> None:
        writes.append(bytes(data))
        record(data)

    transport.write = counted  # type: ignore[method-assign]
    gates = {cid: asyncio.Event() for cid in (1, 2, 3, 4)}

    async def before(cid: int) -> None:
        await gates[cid].wait()

    try:
        async with deferred_answers(broker, before, 4) as handled:
            feed(conn, api_versions(*gates), 1 << 20)
            await until_set(handled)
            assert not writes
            for cid in (1, 2, 3):  # 4 stays pending
                gates[cid].set()
            await until(transport, lambda: len(responses(transport)) == 3)
            assert len(writes) == 1 and correlation_ids(transport) == [1, 2, 3]
            gates[4].set()
            await until(transport, lambda: len(responses(transport)) == 4)
            assert len(writes) == 2
            assert broker.admission.inflight == 0 and conn.inflight == 0
    finally:
        transport.close()


async def test_answers_before_a_failed_one_go_out_before_the_close(broker: Broker) -> None:
    """A deferred answer that fails with a metadata-store error closes the connection
    (clients reconnect and retry), but the answers ready before it are written first:
    their requests were done, and a produce answered that way is not sent again."""
    conn, transport = connect(broker)
    gate = asyncio.Event()

    async def before(cid: int) -> None:
        await gate.wait()
        if cid == 3:
            raise MetaStoreError("the metadata store went away")

    try:
        async with deferred_answers(broker, before, 4) as handled:
            feed(conn, api_versions(1, 2, 3, 4), 1 << 20)
            await until_set(handled)
            gate.set()
            await until(transport, lambda: transport.closed)
            assert correlation_ids(transport) == [1, 2]
    finally:
        transport.close()


async def until_set(event: asyncio.Event) -> None:
    async with asyncio.timeout(WAIT):
        await event.wait()
