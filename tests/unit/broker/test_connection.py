"""broker.connection against hostile input, on an in-process broker (issue 16).

Each malformed-but-framed request gets its exact Kafka error and the connection stays
open (the next request on it is answered); partial frames are budgeted before their
bytes arrive, grow as they arrive, and stalled ones are closed.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.consumer import ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from broker.connection import Connection
from broker.frames import FIRST_CHUNK
from broker.handlers.registry import ApiHandler
from broker.server import Broker
from protocol.batch import crc32c
from protocol.errors import ErrorCode
from protocol.records import build_batch
from tests.fixtures.inprocess import local_config

TOPIC = "t"
WAIT = 30.0  # generous: the machine is shared


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    cfg = local_config(
        tmp_path,
        max_request_bytes=100 << 20,
        queued_max_request_bytes=150 << 20,
        request_read_timeout_ms=2000,
    )
    b = Broker(cfg)
    await b.start()
    await b.topics.create(TOPIC, 1)
    try:
        yield b
    finally:
        await b.stop()


class Client:
    def __init__(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.r, self.w, self.cid = r, w, 0

    async def call(self, req: Any, resp_cls: Any, version: int) -> Any:
        self.cid += 1
        flexible = bool(req.flexible_version_q(version))
        hdr = struct.pack(">hhih", req.API_KEY, version, self.cid, 1) + b"c"
        if flexible:
            hdr += b"\x00"
        body = hdr + bytes(req.encode(version=version))
        self.w.write(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", await asyncio.wait_for(self.r.readexactly(4), WAIT))[0]
        data = await asyncio.wait_for(self.r.readexactly(size), WAIT)
        assert struct.unpack_from(">i", data)[0] == self.cid
        skip = 5 if flexible and req.API_KEY != 18 else 4
        return resp_cls.decode(data[skip:], version=version)

    async def alive(self) -> bool:
        req = ApiVersionsRequest(client_software_name="t", client_software_version="1")
        return (await self.call(req, ApiVersionsResponse, 3)).error_code == 0

    def close(self) -> None:
        self.w.close()


async def connect(b: Broker) -> Client:
    r, w = await asyncio.open_connection("127.0.0.1", b.port)
    return Client(r, w)


def _recrc(batch: bytearray) -> bytes:
    struct.pack_into(">I", batch, 17, crc32c(memoryview(batch)[21:]))
    return bytes(batch)


async def produce(c: Client, batch: bytes, version: int = 9) -> Any:
    req = ProduceRequest(
        transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[(TOPIC, [(0, batch)])]
    )
    resp = await c.call(req, ProduceResponse, version)
    return resp.responses[0].partition_responses[0]


def _lying_count() -> bytes:
    batch = bytearray(build_batch([(b"k", b"v", [])] * 3))
    struct.pack_into(">i", batch, 23, 92_341_797)
    struct.pack_into(">i", batch, 57, 92_341_798)
    return _recrc(batch)


def _control() -> bytes:
    return build_batch([(b"k", b"v", [])], control=True)


def _bad_gzip() -> bytes:
    batch = bytearray(build_batch([(b"k", b"v" * 100, [])] * 3, compression=1))
    batch[70:90] = b"\xaa" * 20
    return _recrc(batch)


def _old_timestamp() -> bytes:
    return build_batch([(b"k", b"v", [])], base_timestamp=1000)


def _bad_crc() -> bytes:
    batch = bytearray(build_batch([(b"k", b"v", [])] * 2))
    batch[-1] ^= 1
    return bytes(batch)


def _wrong_magic() -> bytes:
    batch = bytearray(build_batch([(b"k", b"v", [])]))
    batch[16] = 1
    return bytes(batch)


def _batch_length_lies() -> bytes:
    batch = bytearray(build_batch([(b"k", b"v", [])]))
    struct.pack_into(">i", batch, 8, len(batch) + 50)
    return bytes(batch)


def _record_length_lies() -> bytes:
    batch = bytearray(build_batch([(b"k", b"value", [])] * 2))
    batch[61] += 4  # the first record's length varint
    return _recrc(batch)


def _bad_pid() -> bytes:
    return build_batch([(b"k", b"v", [])], producer_id=7, producer_epoch=-1, base_sequence=0)


@pytest.mark.parametrize(
    ("make", "version", "code", "record_index"),
    [
        (_lying_count, 9, ErrorCode.INVALID_RECORD, 3),
        (_lying_count, 7, ErrorCode.CORRUPT_MESSAGE, None),
        (_control, 9, ErrorCode.INVALID_RECORD, None),
        (_bad_gzip, 9, ErrorCode.CORRUPT_MESSAGE, None),
        (_bad_pid, 8, ErrorCode.INVALID_RECORD, None),
        (_bad_crc, 9, ErrorCode.CORRUPT_MESSAGE, None),
        (_wrong_magic, 9, ErrorCode.CORRUPT_MESSAGE, None),
        (_batch_length_lies, 9, ErrorCode.CORRUPT_MESSAGE, None),
        (_record_length_lies, 9, ErrorCode.INVALID_RECORD, 0),
        (_record_length_lies, 3, ErrorCode.CORRUPT_MESSAGE, None),
    ],
)
async def test_corrupt_batch_answered_and_partition_unchanged(
    broker: Broker, make: Any, version: int, code: ErrorCode, record_index: int | None
) -> None:
    c = await connect(broker)
    try:
        assert (await produce(c, build_batch([(b"k", b"first", [])]))).error_code == 0
        lg = await broker.logs.get(TOPIC, 0)
        before = lg.next_offset
        p = await produce(c, make(), version)
        assert p.error_code == code
        assert p.base_offset == -1
        if version >= 8:
            assert p.error_message
            got = [e.batch_index for e in p.record_errors]
            assert got == ([] if record_index is None else [record_index])
        assert lg.next_offset == before
        assert await c.alive()
        assert (await produce(c, build_batch([(b"k", b"next", [])]))).base_offset == before
    finally:
        c.close()


async def test_timestamp_out_of_bounds(broker: Broker) -> None:
    await broker.topics.alter_configs(TOPIC, {"message.timestamp.before.max.ms": "60000"})
    c = await connect(broker)
    try:
        p = await produce(c, _old_timestamp())
        assert p.error_code == ErrorCode.INVALID_TIMESTAMP
        assert await c.alive()
    finally:
        c.close()


async def test_max_timestamp_minus_one_is_recomputed(broker: Broker) -> None:
    """sarama 1.22's batches carry maxTimestamp = -1: ListOffsets by time still works."""
    c = await connect(broker)
    try:
        ts = 1_700_000_000_000
        batch = bytearray(build_batch([(b"k", b"v", [])] * 2, timestamps=[ts, ts + 50]))
        struct.pack_into(">q", batch, 35, -1)
        assert (await produce(c, _recrc(batch))).error_code == 0
        req = ListOffsetsRequest(
            replica_id=-1, isolation_level=0, topics=[(TOPIC, [(0, -1, ts + 10)])]
        )
        resp = await c.call(req, ListOffsetsResponse, 7)
        p = resp.topics[0].partitions[0]
        assert (p.error_code, p.offset, p.timestamp) == (0, 1, ts + 50)
    finally:
        c.close()


async def test_list_offsets_null_topics(broker: Broker) -> None:
    c = await connect(broker)
    try:
        body = struct.pack(">ibi", -1, 0, -1)  # v5: replica, isolation, null topic array
        c.cid += 1
        frame = struct.pack(">hhih", 2, 5, c.cid, 1) + b"c" + body
        c.w.write(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", await asyncio.wait_for(c.r.readexactly(4), WAIT))[0]
        data = await asyncio.wait_for(c.r.readexactly(size), WAIT)
        resp = ListOffsetsResponse.decode(data[4:], version=5)
        assert resp.topics == []
        assert await c.alive()
    finally:
        c.close()


async def test_handler_failure_answers_unknown_server_error(broker: Broker) -> None:
    """A handler that raises (a stand-in for a handler bug) gets UNKNOWN_SERVER_ERROR
    where the response has a top-level error code; the connection stays open."""
    from kafka.protocol.admin import DescribeClusterRequest, DescribeClusterResponse

    async def broken(ctx: Any, request: Any) -> Any:
        raise TypeError("bug")

    real = broker.routes[60]
    broker.routes[60] = ApiHandler(
        real.key, real.min_version, real.max_version, broken, real.decode
    )
    c = await connect(broker)
    try:
        resp = await c.call(DescribeClusterRequest(), DescribeClusterResponse, 0)
        assert resp.error_code == ErrorCode.UNKNOWN_SERVER_ERROR
        assert await c.alive()
    finally:
        broker.routes[60] = real
        c.close()


async def test_store_unavailable_closes_so_clients_retry(broker: Broker) -> None:
    """The metadata store failing under a handler is not a handler bug: the connection is
    closed (as a client sees a broker restart) rather than answered with an error that
    would fail the client's records for good."""
    from kafka.protocol.admin import DescribeClusterRequest, DescribeClusterResponse

    from broker.meta.base import MetaStoreError

    async def unavailable(ctx: Any, request: Any) -> Any:
        raise MetaStoreError("etcd unavailable")

    real = broker.routes[60]
    broker.routes[60] = ApiHandler(real.key, real.min_version, real.max_version, unavailable, None)
    c = await connect(broker)
    try:
        with pytest.raises(asyncio.IncompleteReadError):
            await c.call(DescribeClusterRequest(), DescribeClusterResponse, 0)
    finally:
        broker.routes[60] = real
        c.close()
    other = await connect(broker)
    try:
        assert await other.alive()
    finally:
        other.close()


def _conns(b: Broker) -> list[Connection]:
    return list(b.connections)


async def _until(cond: Any) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not cond():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_announced_frames_are_budgeted_not_allocated(broker: Broker) -> None:
    """Two 100 MiB announcements against a 150 MiB budget: the first is reserved with a
    small buffer, the second waits without reading; when the first closes, the second
    gets the reservation. The broker serves other clients throughout."""
    first, second = await connect(broker), await connect(broker)
    try:
        first.w.write(struct.pack(">i", 100 << 20) + b"x" * 1000)
        await _until(lambda: broker.admission.frame_bytes == 100 << 20)
        second.w.write(struct.pack(">i", 100 << 20) + b"y" * 1000)
        await _until(lambda: any(c.waiting_for_memory for c in _conns(broker)))
        holder = next(c for c in _conns(broker) if c.reserved)
        assert holder._frame is not None and len(holder._frame) <= FIRST_CHUNK < 100 << 20
        other = await connect(broker)
        assert await other.alive()
        other.close()
        first.close()
        await _until(
            lambda: (
                any(c.reserved for c in _conns(broker))
                and not any(c.waiting_for_memory for c in _conns(broker))
            )
        )
        assert broker.admission.frame_bytes == 100 << 20
    finally:
        first.close()
        second.close()
    await _until(lambda: broker.admission.frame_bytes == 0 and not broker.connections)


async def test_frame_grows_to_its_size_and_is_served(broker: Broker) -> None:
    """A 3 MiB produce sent in pieces arrives through a growing buffer intact."""
    c = await connect(broker)
    try:
        value = bytes(range(256)) * (3 * 4096)
        p = await produce(c, build_batch([(b"big", value, [])]))
        assert p.error_code == 0
        got = await broker.logs.read(await broker.logs.get(TOPIC, 0), 0, 8 << 20)
        assert any(value in bytes(v) for v in got)
    finally:
        c.close()


@pytest.mark.parametrize(
    "partial",
    [
        struct.pack(">i", 1 << 20) + b"z" * 100,  # a large frame: its own buffer
        struct.pack(">i", 1000) + b"z" * 10,  # a small one: waits in the scratch buffer
        b"\x00\x00",  # half a length
    ],
)
async def test_stalled_frame_closes_the_connection(broker: Broker, partial: bytes) -> None:
    c = await connect(broker)
    try:
        assert await c.alive()  # a complete request first: the deadline is per frame
        c.w.write(partial)
        assert await asyncio.wait_for(c.r.read(), WAIT) == b""  # closed by the broker
    finally:
        c.close()
    await _until(lambda: broker.admission.frame_bytes == 0 and not broker.connections)


async def test_a_slow_but_complete_frame_is_served(broker: Broker) -> None:
    """Progress in pieces well within the deadline: the request is answered."""
    c = await connect(broker)
    try:
        req = ApiVersionsRequest(client_software_name="t", client_software_version="1")
        body = struct.pack(">hhih", 18, 3, 99, 1) + b"c" + b"\x00" + bytes(req.encode(version=3))
        frame = struct.pack(">i", len(body)) + body
        for i in range(0, len(frame), 3):
            c.w.write(frame[i : i + 3])
            await c.w.drain()
            await asyncio.sleep(0.01)
        size = struct.unpack(">i", await asyncio.wait_for(c.r.readexactly(4), WAIT))[0]
        data = await asyncio.wait_for(c.r.readexactly(size), WAIT)
        assert struct.unpack_from(">i", data)[0] == 99
    finally:
        c.close()
