"""Crash recovery (issue 2, "Recovery"), on the local store with the embedded metadata
and on SeaweedFS with etcd.

A confluent-kafka producer (acks=all) writes while the broker is ``kill -9``-ed at a
random moment; after a restart every acknowledged record is readable at its original
offset, offsets are contiguous, the manifest is contiguous and every segment it lists
validates (and ``kafscale segments inspect`` accepts one), and the next produce continues
at the log end. A stray segment object at the next key (a crash between upload and
commit) is replaced by the next flush, never served.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message, Producer

from protocol.records import build_batch
from segments.format import parse_object_name, segment_key
from segments.local_store import DIRECT_MIN_BYTES
from segments.writer import build_segment
from tests.fixtures.broker import BrokerProcess, start_broker
from tests.integration import kafka_raw as kr
from tests.integration.backends import make_backend
from tests.integration.deliveries import acked_at, missing
from tests.integration.logcheck import Backend, check_partition, inspect_cli, put_object

pytestmark = pytest.mark.integration

MAX_MESSAGES = 200_000
PARTS = 3


@pytest.fixture(params=["local", "s3-etcd"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request, request.param, tmp_path / "backend")


@pytest.fixture
def started() -> Iterator[list[BrokerProcess]]:
    """Every broker a test starts; all are stopped by PID at teardown, even on failure."""
    procs: list[BrokerProcess] = []
    try:
        yield procs
    finally:
        for b in procs:
            b.kill9()
            print(f"--- broker {b.port} log ---\n{b.log_text()[-6000:]}")


def _start(
    backend: Backend, workdir: Path, started: list[BrokerProcess], *extra: str
) -> BrokerProcess:
    b = start_broker(
        workdir,
        store_url=backend.store_url,
        meta_url=backend.meta_url,
        extra_args=(*backend.broker_args(), *extra),
    )
    started.append(b)
    return b


def _inspect_target(backend: Backend, key: str) -> str:
    if backend.store_url.startswith("file://"):
        return backend.store_url[len("file://") :] + "/" + key
    base, _, query = backend.store_url.partition("?")
    return f"{base.rstrip('/')}/{key}?{query}"


class CrashLoad:
    """A confluent-kafka producer (acks=all) that records every acknowledged record's
    (partition, offset) and keeps a steady load until the broker dies."""

    def __init__(self, b: BrokerProcess, topic: str, idempotent: bool, pad: int = 0) -> None:
        self.b, self.topic, self.pad = b, topic, b"." * pad
        self.acked: dict[bytes, tuple[int, int]] = {}
        self.lock = threading.Lock()
        self.loaded = threading.Event()  # the first record of the load phase is acked
        self.sent = 0
        self.p = Producer(
            {
                "bootstrap.servers": b.bootstrap,
                "acks": "all",
                "linger.ms": 2,
                "message.timeout.ms": 30000,
                "retry.backoff.ms": 100,
                "reconnect.backoff.max.ms": 300,
                "enable.idempotence": idempotent,
                "log_level": 0,
            }
        )

    def _cb(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            with self.lock:
                self.acked[msg.value() or b""] = acked_at(msg)
            if (msg.value() or b"").startswith(b"m-"):
                self.loaded.set()

    def value(self, i: int) -> bytes:
        """The load's ``i``-th value: ``m-<i>``, padded with dots to its size."""
        return b"m-%d" % i + self.pad

    def warm_up(self, n: int) -> None:
        for i in range(n):
            self.p.produce(self.topic, key=b"w%d" % i, value=b"warm-%d" % i, on_delivery=self._cb)
        assert self.p.flush(20) == 0 and len(self.acked) == n

    def until_killed(self, kill_after: float) -> dict[bytes, tuple[int, int]]:
        """Produce until a thread kills the broker ``kill_after`` s after the first load
        ack; return what was acknowledged by then."""

        def kill_under_load() -> None:
            self.loaded.wait(30)  # set from the producer's callbacks in the main thread
            time.sleep(kill_after)  # the random moment, counted from the first load ack
            self.b.kill9()

        killer = threading.Thread(target=kill_under_load)
        killer.start()
        proc = self.b.proc
        while proc is not None and proc.poll() is None and self.sent < MAX_MESSAGES:
            for _ in range(100):  # steady load up to the kill, paced by polling
                i = self.sent
                try:
                    self.p.produce(
                        self.topic, key=b"k%d" % (i % 7), value=self.value(i), on_delivery=self._cb
                    )
                except BufferError:
                    break
                self.sent += 1
            self.p.poll(0.005)
        killer.join()
        with self.lock:
            return dict(self.acked)


def _check_recovered(
    backend: Backend, b: BrokerProcess, load: CrashLoad, idempotent: bool, seed: int
) -> None:
    """Every acked record at its (partition, offset); contiguous, valid logs; the next
    produce continues at each log end."""
    produced = {b"warm-%d" % j for j in range(100)} | {load.value(j) for j in range(load.sent)}
    found: dict[bytes, tuple[int, int]] = {}
    for part in range(PARTS):
        got = kr.fetch_all(b.port, load.topic, part)
        assert got.error_code == 0
        offsets = [o for o, _, _ in got.records]
        assert offsets == list(range(got.high_watermark)), f"seed {seed}: gap in {part}"
        values = [v or b"" for _, _, v in got.records]
        assert set(values) <= produced  # nothing half-written or foreign
        if idempotent:  # retries across the crash were deduplicated, in order
            assert len(values) == len(set(values)), f"seed {seed}: duplicates in {part}"
            sent = [v for v in values if v.startswith(b"m-")]
            assert sent == sorted(sent, key=lambda v: int(v[2:].rstrip(b".")))
        found.update({v: (part, o) for o, _, v in got.records if v is not None})
        state = check_partition(backend, load.topic, part)
        assert state.next_offset == got.high_watermark
        assert state.epoch >= 2  # the restart took ownership again
        batch = build_batch([(b"after", b"restart", None)])
        res = kr.produce_raw(b.port, load.topic, part, batch)
        assert res.error_code == 0 and res.base_offset == got.high_watermark
    lost = missing(load.acked, found)
    head = list(lost.items())[:3]
    assert not lost, f"seed {seed}: {len(lost)} acked records lost or moved: {head}"
    if idempotent:
        assert len(found) == len(load.acked)


@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "idempotent"])
def test_kill9_during_acks_all_produce(
    backend: Backend, tmp_path: Path, started: list[BrokerProcess], idempotent: bool
) -> None:
    """Several partitions, so a flush cycle's one transaction spans them all."""
    seed = random.randrange(1 << 30)
    kill_after = random.Random(seed).uniform(0.05, 1.2)
    b = _start(backend, tmp_path / "broker", started, "--default-partitions", str(PARTS))
    load = CrashLoad(b, "recover", idempotent)
    load.warm_up(100)  # the topic exists and some data is durable before the crash
    before = load.until_killed(kill_after)
    print(f"seed {seed}: killed {kill_after:.2f}s in, {load.sent} sent, {len(before)} acked")
    b.start()  # same port, same store and metadata
    assert load.p.flush(45) == 0
    assert load.loaded.is_set() and len(before) > 100, f"seed {seed}: no load acked"
    _check_recovered(backend, b, load, idempotent, seed)
    b.stop()
    state = check_partition(backend, load.topic, 0)
    out = inspect_cli(_inspect_target(backend, state.keys[-1]))
    assert out.returncode == 0, out.stdout + out.stderr
    assert str(state.next_offset - 1) in out.stdout
    assert "Traceback" not in b.log_text()


def test_kill9_during_flush_cycles_written_past_the_page_cache(
    request: pytest.FixtureRequest, tmp_path: Path, started: list[BrokerProcess]
) -> None:
    """Flush cycles of several MiB per partition, which the local store writes with
    O_DIRECT (``DIRECT_MIN_BYTES``, docs/benchmarks.md "Round 25"): every acknowledged
    record survives a kill -9 among them, and such segments were written."""
    backend = make_backend(request, "local", tmp_path / "backend")
    seed = random.randrange(1 << 30)
    kill_after = random.Random(seed).uniform(0.3, 1.5)
    # cycles by size or age only: buffers grow to --flush-bytes (4 MiB) between cycles
    b = _start(backend, tmp_path / "broker", started, "--default-partitions", str(PARTS),
               "--flush-when-idle", "false", "--flush-interval-ms", "1000")  # fmt: skip
    # plain: requests pipelined (an idempotent producer's one request in flight per
    # partition makes ~1 MB cycles)
    load = CrashLoad(b, "recover-large", idempotent=False, pad=4000)
    load.warm_up(100)
    before = load.until_killed(kill_after)
    print(f"seed {seed}: killed {kill_after:.2f}s in, {load.sent} sent, {len(before)} acked")
    b.start()
    assert load.p.flush(45) == 0
    _check_recovered(backend, b, load, False, seed)
    root = Path(backend.store_url[len("file://") :])
    sizes = [p.stat().st_size for p in root.rglob("*.kfs")]
    assert max(sizes) >= DIRECT_MIN_BYTES, f"seed {seed}: segment sizes {sorted(sizes)[-5:]}"
    logs = [kr.fetch_all(b.port, load.topic, part).records for part in range(PARTS)]
    b.kill9()  # again: a new process reads every segment back from the disk
    b.start()
    for part in range(PARTS):
        assert kr.fetch_all(b.port, load.topic, part).records == logs[part], f"seed {seed}"
    assert "Traceback" not in b.log_text()


def test_stray_segment_is_never_served_nor_overwritten(
    backend: Backend, tmp_path: Path, started: list[BrokerProcess]
) -> None:
    b = _start(backend, tmp_path / "broker", started)
    topic = "stray"
    for n in range(3):
        batch = build_batch([(b"k", b"real-%d" % n, None)])
        assert kr.produce_raw(b.port, topic, 0, batch).base_offset == n
    b.kill9()
    # a crashed owner uploaded the next segment but never committed it
    fake = build_segment(
        3, [memoryview(bytearray(build_batch([(b"k", b"GHOST", None)] * 5, base_offset=3)))], 0
    )
    put_object(backend, segment_key("default", topic, 0, 3), b"".join(fake.buffers))
    b.start()
    got = kr.fetch_all(b.port, topic, 0)
    assert got.high_watermark == 3
    assert [v for _, _, v in got.records] == [b"real-0", b"real-1", b"real-2"]
    assert kr.fetch_records(b.port, topic, 0, 3).records == []
    res = kr.produce_raw(b.port, topic, 0, build_batch([(b"k", b"real-3", None)]))
    assert res.error_code == 0 and res.base_offset == 3
    got = kr.fetch_all(b.port, topic, 0)
    assert [v for _, _, v in got.records] == [b"real-%d" % n for n in range(4)]
    assert got.high_watermark == 4
    state = check_partition(backend, topic, 0)
    assert state.next_offset == 4 and segment_key("default", topic, 0, 3) not in state.keys
    # the new segment at 3 has a name of its own (the writer's epoch is in it); the
    # stray is left for a sweep after the grace period, never deleted by the write path
    name = parse_object_name(state.keys[-1].rsplit("/", 1)[-1])
    assert name is not None and name.base == 3 and name.epoch == state.epoch
    b.stop()
    assert "Traceback" not in b.log_text()


def test_clean_restart_keeps_everything(
    backend: Backend, tmp_path: Path, started: list[BrokerProcess]
) -> None:
    """SIGTERM flushes and releases; a restart serves the same log and continues it."""
    b = _start(backend, tmp_path / "broker", started)
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(500):
        p.produce("clean", value=b"c-%d" % i)
    assert p.flush(20) == 0
    t0 = time.monotonic()
    assert b.stop() == 0
    assert time.monotonic() - t0 < 15
    b.start()
    got = kr.fetch_all(b.port, "clean", 0)
    assert [v for _, _, v in got.records] == [b"c-%d" % i for i in range(500)]
    res = kr.produce_raw(b.port, "clean", 0, build_batch([(None, b"c-500", None)]))
    assert res.base_offset == 500
    b.stop()
    check_partition(backend, "clean", 0)
