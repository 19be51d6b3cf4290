"""A failed flush under an idempotent producer's window of requests (broker/producers.py,
rollback): the producer keeps its place in its sequence, so a later batch of its window
that reaches the broker before the failed ones' retries is refused as out of order.
Accepting it would lose data: a client takes a later batch's success as proof that the
earlier batches were stored (librdkafka then acknowledges them without an offset).

In-process broker over a real local-directory store and the real embedded metadata
store, wrapped only to fail one chosen PUT; the client is a raw TCP connection sending
pipelined Produce requests, as a client with several requests in flight does."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Message, Producer
from kafka.protocol.producer import ProduceResponse

from broker.config import BrokerConfig
from broker.meta.schema import owner_key
from broker.partition import PartitionLog
from broker.server import Broker
from protocol.errors import ErrorCode
from protocol.records import build_batch
from segments.store import Buffer, ObjectStore, StoreError
from tests.fixtures.broker import free_port
from tests.fixtures.inprocess import local_config
from tests.integration import kafka_raw as kr
from tests.integration.broker.test_flush_pipeline import TOPIC, gate, node, values
from tests.integration.deliveries import acked_at, missing
from tests.integration.test_java_client import java_libs

__all__ = ["node"]  # the fixture, shared with the pipeline tests

PID, EPOCH = 4242, 0
JAVA_SOURCE = Path(__file__).parents[1] / "java" / "IdempotentWindow.java"


class Pipelined:
    """One connection that sends Produce requests without waiting for their answers."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.cid = 0

    @classmethod
    async def open(cls, b: Broker) -> Pipelined:
        reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
        return cls(reader, writer)

    def send(self, seq: int, tag: str) -> int:
        """Sequences ``seq`` and ``seq + 1`` of the producer: ``tag-0``, ``tag-1``."""
        recs = [(None, f"{tag}-{j}".encode(), None) for j in range(2)]
        return self.send_batch(
            build_batch(recs, producer_id=PID, producer_epoch=EPOCH, base_sequence=seq)
        )

    def send_batch(self, batch: bytes) -> int:
        self.cid += 1
        self.writer.write(kr.request_bytes(kr.produce_request(TOPIC, 0, batch), 8, self.cid))
        return self.cid

    async def answer(self, cid: int) -> tuple[int, int]:
        """(error code, base offset) of the next answer, which must be ``cid``'s."""
        async with asyncio.timeout(30):
            (size,) = struct.unpack(">i", await self.reader.readexactly(4))
            data = await self.reader.readexactly(size)
        assert struct.unpack_from(">i", data)[0] == cid
        resp: Any = ProduceResponse.decode(data, version=8, header=True)
        part = resp.responses[0].partition_responses[0]
        return part.error_code, part.base_offset

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


async def test_a_later_batch_after_a_failed_window_is_out_of_order(node: Broker) -> None:
    store = gate(node, 0, fail=True)  # the first segment's PUT waits, then fails
    conn = await Pipelined.open(node)
    try:
        a = conn.send(0, "a")  # sequences 0-1
        async with asyncio.timeout(30):
            await store.entered.wait()
        b = conn.send(2, "b")  # sequences 2-3, appended behind the held cycle
        lg = await node.logs.get(TOPIC, 0)
        async with asyncio.timeout(30):
            while lg.next_offset < 4:  # b appended (its cycle may upload meanwhile)
                await asyncio.sleep(0.01)
        store.release.set()
        assert await conn.answer(a) == (ErrorCode.KAFKA_STORAGE_ERROR, -1)
        assert await conn.answer(b) == (ErrorCode.KAFKA_STORAGE_ERROR, -1)
        store.held = None
        # a request of the same window, sent before the client saw the failures
        c = conn.send(4, "c")
        assert (await conn.answer(c))[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        # the client's retries, in order, are stored where the log left off
        for seq, tag, offset in ((0, "a", 0), (2, "b", 2), (4, "c", 4)):
            assert await conn.answer(conn.send(seq, tag)) == (ErrorCode.NONE, offset)
    finally:
        await conn.close()
    assert await values(node, lg) == [b"a-0", b"a-1", b"b-0", b"b-1", b"c-0", b"c-1"]


class UnreadableStore:
    """The real store, whose reads fail (StoreError) while ``failing``."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.failing = True
        self.refused = 0

    def _check(self, key: str) -> None:
        if self.failing:
            self.refused += 1
            raise StoreError(f"injected failure reading {key}")

    async def get(self, key: str, *args: Any) -> bytes:
        self._check(key)
        return await self.inner.get(key, *args)

    async def get_buffer(self, key: str, *args: Any) -> Buffer:
        self._check(key)
        return await self.inner.get_buffer(key, *args)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def no_snapshot_at_release(b: Broker) -> None:
    """``b`` gives its owner keys back without a producer snapshot, as a crashed broker
    leaves none (broker.producer_snapshot): the next owner reads segments."""
    release = b.logs._release_key

    async def bare(lg: PartitionLog, *, keep_producers: bool = False) -> None:
        await release(lg)

    b.logs._release_key = bare  # type: ignore[method-assign]


async def first_owner(cfg: BrokerConfig, plain: int) -> None:
    """A first broker writes the producer's sequences 0-1 ("a"), then ``plain`` batches
    of another, plain producer, one segment each, and stops without leaving a producer
    snapshot (its maintenance writes none that soon either)."""
    first = Broker(cfg)
    await first.start()
    no_snapshot_at_release(first)
    try:
        await first.topics.create(TOPIC, 1)
        conn = await Pipelined.open(first)
        assert await conn.answer(conn.send(0, "a")) == (ErrorCode.NONE, 0)
        for i in range(plain):  # one segment per round trip
            cid = conn.send_batch(build_batch([(None, b"o%d" % i, None)]))
            assert await conn.answer(cid) == (ErrorCode.NONE, 2 + i)
        await conn.close()
        lg = await first.logs.get(TOPIC, 0)
        assert len(lg.segments) == 1 + plain
    finally:
        await first.stop()


async def test_a_takeover_that_cannot_read_the_producer_state_does_not_serve(
    tmp_path: Path,
) -> None:
    """The new owner cannot read the newest segment: it answers NOT_LEADER_OR_FOLLOWER
    and gives the partition back, instead of serving with the producer unknown (which
    would append a retried batch a second time)."""
    cfg = local_config(tmp_path)
    await first_owner(cfg, 0)
    node = Broker(cfg)
    await node.start()
    store = UnreadableStore(node.logs.store)
    node.logs.store = store  # type: ignore[assignment]
    conn = await Pipelined.open(node)
    try:
        # the client's retry of the batch it saw no answer for, to the new owner
        assert (await conn.answer(conn.send(0, "a")))[0] == ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert store.refused > 0 and (TOPIC, 0) not in node.logs.logs
        assert await node.meta.get(owner_key(TOPIC, 0)) is None  # given back
        store.failing = False
        assert await conn.answer(conn.send(0, "a")) == (ErrorCode.NONE, 0)  # a duplicate
        assert await conn.answer(conn.send(2, "b")) == (ErrorCode.NONE, 2)
        lg = await node.logs.get(TOPIC, 0)
        assert await values(node, lg) == [b"a-0", b"a-1", b"b-0", b"b-1"]
    finally:
        await conn.close()
        node.logs.store = store.inner
        await node.stop()


async def test_a_producer_behind_several_small_segments_is_still_known(tmp_path: Path) -> None:
    """The new owner knows a producer whose last batch is six small segments back (other
    producers' flush cycles since): a later batch of its window is refused as out of
    order instead of being accepted at any sequence."""
    cfg = local_config(tmp_path)
    await first_owner(cfg, 6)
    node = Broker(cfg)
    await node.start()
    conn = await Pipelined.open(node)
    try:
        # sequences 2-3 went astray with the old owner; 4-5 reach the new one first
        assert (await conn.answer(conn.send(4, "c")))[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert await conn.answer(conn.send(2, "b")) == (ErrorCode.NONE, 8)
        assert await conn.answer(conn.send(4, "c")) == (ErrorCode.NONE, 10)
    finally:
        await conn.close()
        await node.stop()


async def test_librdkafka_retries_a_failed_window_and_loses_nothing(tmp_path: Path) -> None:
    """A real idempotent librdkafka producer with its window of five requests in flight
    when the flush under them fails: it retries, and every record it was told was
    delivered is stored once, in order, where its report said (or anywhere, for one
    reported without an offset)."""
    port = free_port()  # advertised to the client in Metadata
    node = Broker(local_config(tmp_path, listen_port=port, advertised_port=port))
    await node.start()
    try:
        await node.topics.create(TOPIC, 1)
        await _window_fails(node)
    finally:
        node.logs.store = getattr(node.logs.store, "inner", node.logs.store)
        await node.stop()


async def _window_fails(node: Broker) -> None:
    store = gate(node, 0, fail=True)
    acked: dict[bytes, tuple[int, int]] = {}
    errors: list[str] = []

    def report(err: KafkaError | None, msg: Message) -> None:
        if err is None:
            acked[msg.value() or b""] = acked_at(msg)
        else:
            errors.append(str(err))

    p = Producer(
        {
            "bootstrap.servers": f"127.0.0.1:{node.port}",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 0,
            "batch.num.messages": 1,  # one request per record: a window of five in flight
            "retry.backoff.ms": 50,
            "log_level": 0,
        }
    )
    try:
        for i in range(40):
            p.produce(TOPIC, value=b"m-%d" % i, partition=0, on_delivery=report)
        p.poll(0)
        lg = await node.logs.get(TOPIC, 0)
        async with asyncio.timeout(60):
            await store.entered.wait()
            while lg.next_offset < 5:  # the client's whole window is appended
                await asyncio.sleep(0.01)
        store.held = None  # later PUTs succeed
        store.release.set()  # the held one fails
        assert await asyncio.to_thread(p.flush, 60) == 0
    finally:  # the client's teardown waits on this event loop's broker: off the loop
        store.release.set()
        await asyncio.to_thread(p.purge)
        await asyncio.to_thread(p.flush, 5)
    assert not errors, errors[:3]
    got = await values(node, lg)
    assert got == [b"m-%d" % i for i in range(40)]  # once each, in order
    found = {v: (0, o) for o, v in enumerate(got)}
    assert len(acked) == 40 and not missing(acked, found)


async def test_the_java_client_retries_a_failed_window_and_loses_nothing(tmp_path: Path) -> None:
    """The same with kafka-clients 4.x (idempotent by default, five requests in flight,
    a few records per request): the batches behind the failed one are refused or fail
    and are retried, none is lost, duplicated or reported failed."""
    libs = java_libs()
    clients = next(iter(libs.glob("kafka-clients-4.*.jar")))
    classes = tmp_path / "classes"
    javac = await asyncio.create_subprocess_exec(
        "javac", "-d", str(classes), "-cp", str(clients), str(JAVA_SOURCE)
    )
    assert await asyncio.wait_for(javac.wait(), 120) == 0
    port = free_port()
    node = Broker(local_config(tmp_path / "b", listen_port=port, advertised_port=port))
    await node.start()
    store = gate(node, 0, fail=True)
    try:
        await node.topics.create(TOPIC, 1)
        lg = await node.logs.get(TOPIC, 0)
        java = await asyncio.create_subprocess_exec(
            "java", "-cp", f"{classes}:{libs}/*", "IdempotentWindow", f"127.0.0.1:{port}",
            TOPIC, "200", stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            async with asyncio.timeout(120):
                await store.entered.wait()
                while lg.next_offset < 6:  # more requests of the window behind the held PUT
                    await asyncio.sleep(0.01)
            store.held = None
            store.release.set()  # the held PUT fails
            out, _ = await asyncio.wait_for(java.communicate(), 180)
        finally:
            if java.returncode is None:
                java.kill()
                await java.wait()
        lines = out.decode().splitlines()
        assert "done=true" in lines and java.returncode == 0
        assert not [ln for ln in lines if ln.startswith("err ")]
        acked = {
            f[1].encode(): (0, int(f[2])) for f in (ln.split() for ln in lines) if f[0] == "ack"
        }
        got = [v.split(b" ")[0] for v in await values(node, lg)]
        assert got == [b"m-%d" % i for i in range(200)]  # once each, in order
        assert not missing(acked, {v: (0, o) for o, v in enumerate(got)}) and len(acked) == 200
    finally:
        store.release.set()
        node.logs.store = store.inner
        await node.stop()
