"""A bounded randomized soak: three brokers, one at a time frozen (SIGSTOP) for longer
than its lease and woken (SIGCONT), while idempotent producers (librdkafka, acks=all)
write at a steady pace. After every wake-up, every partition is read back from the live
cluster: nothing acknowledged is lost or duplicated, offsets are contiguous, and each
record sits at the offset its delivery report gave. Then once more after a cold restart.

The seed is printed (and can be set with KAFSCALE_SOAK_SEED) so a failing run replays the
same choice of brokers and freeze lengths.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.deliveries import acked_at
from tests.integration.logcheck import check_partition
from tests.integration.zombie_cluster import (
    FAST_MAINTENANCE,
    LEASE_TTL,
    WAIT,
    ZCluster,
    assert_exactly,
)

pytestmark = pytest.mark.integration

PARTITIONS = 6
WAKE_UPS = 6  # rounds: each freezes one broker past its lease and wakes it


class _IdempotenceLog(logging.Logger):
    """Keeps librdkafka's log lines that change the idempotent producer's id or epoch
    (a re-send under a new epoch is a duplicate by the client's own rules)."""

    WORDS = ("bump", "reset", "epoch", "Drain", "fatal", "Fatal")

    def __init__(self, into: list[str]) -> None:
        super().__init__("librdkafka.eos")
        self.into = into

    def log(self, level: int, msg: object, *args: object, **kwargs: object) -> None:
        text = str(msg) % args if args else str(msg)
        if any(w in text for w in self.WORDS) and "Ignoring" not in text:
            self.into.append(text)


class SteadyProducer:
    """An idempotent librdkafka producer writing at a steady pace in its own thread;
    records every acknowledged (partition, offset)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.acked: dict[bytes, tuple[int, int]] = {}
        self.errors: list[str] = []
        self.sent = 0
        self.idempotence: list[str] = []  # librdkafka's epoch bumps and resets
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.p = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": 120000,
                "request.timeout.ms": 5000,
                "retry.backoff.ms": 100,
                "topic.metadata.refresh.interval.ms": 500,
                "debug": "eos",
                "logger": _IdempotenceLog(self.idempotence),
            }
        )

    def _cb(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            self.acked[msg.value() or b""] = acked_at(msg)
        else:
            self.errors.append(str(err))

    def _run(self) -> None:
        while not self._stop.is_set():
            for _ in range(20):
                self.p.produce(
                    self.topic,
                    value=f"r-{self.sent}".encode(),
                    partition=self.sent % PARTITIONS,
                    on_delivery=self._cb,
                )
                self.sent += 1
            self.p.poll(0.05)

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def pause(self) -> None:
        """Stop producing and wait for every outstanding delivery report."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        assert self.p.flush(120) == 0, "deliveries still outstanding"
        print(f"producer epoch bumps and resets: {len(self.idempotence)}")
        for line in self.idempotence[:10]:
            print(f"  {line}")
        assert not self.errors, self.errors[:5]


def verify(zc: ZCluster, topic: str, acked: dict[bytes, tuple[int, int]]) -> None:
    for p in range(PARTITIONS):
        mine = {v: o for v, (part, o) in acked.items() if part == p}
        assert_exactly(zc.read(topic, p), mine)


def wait_rejoined(zc: ZCluster, topic: str) -> None:
    """Every broker lists all three brokers again (the woken one re-registered)."""
    from tests.integration import kafka_raw as kr

    deadline = time.monotonic() + WAIT
    views: list[set[int]] = []
    while time.monotonic() < deadline:  # other processes' views: polled
        views = [
            {b.node_id for b in kr.metadata(zc.brokers[n].port, [topic]).brokers} for n in zc.live()
        ]
        if all(v == {1, 2, 3} for v in views):
            return
        time.sleep(0.2)
    raise AssertionError(f"the woken broker never rejoined: brokers seen by each {views}")


def test_soak_repeated_zombies_lose_nothing(zc: ZCluster) -> None:
    seed = int(os.environ.get("KAFSCALE_SOAK_SEED", str(int(time.time()))))
    rng = random.Random(seed)
    print(f"soak seed {seed}")
    for n in (1, 2, 3):
        zc.start(n, *FAST_MAINTENANCE)
    topic = "soak"
    admin = AdminClient({"bootstrap.servers": zc.brokers[1].bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS)])[topic].result(30)
    prod = SteadyProducer(",".join(b.bootstrap for b in zc.brokers.values()), topic)
    survived = 0
    for round_ in range(WAKE_UPS):
        victim = rng.choice([1, 2, 3])
        frozen_s = LEASE_TTL + 1 + rng.random() * 2 * LEASE_TTL
        prod.start()
        time.sleep(0.5)  # a steady load first: the victim owns some partitions
        zc.freeze(victim)
        time.sleep(frozen_s)  # the test's own schedule: the freeze outlives the lease
        zc.wake(victim)
        wait_rejoined(zc, topic)
        prod.pause()
        verify(zc, topic, prod.acked)
        survived += 1
        print(f"round {round_}: froze {victim} for {frozen_s:.1f}s; {len(prod.acked)} acked")
    print(f"soak: {survived} wake-ups survived, {len(prod.acked)} records acknowledged")
    assert len(prod.acked) > 0
    zc.restart_all()
    verify(zc, topic, prod.acked)
    for p in range(PARTITIONS):
        check_partition(zc.backend, topic, p)
