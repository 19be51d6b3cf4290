"""The metadata store stalls and dies under produce load (docs/format.md, "Commits of
unknown outcome"): three brokers on SeaweedFS and a real etcd of their own; etcd is
frozen (SIGSTOP) past the brokers' leases, then stalled a few more times, then killed
(SIGKILL) and restarted on its data directory, while idempotent librdkafka producers
write at a steady pace. Commits cut off mid-call have an unknown outcome; the brokers
must resolve them, acknowledge exactly what was committed and delete nothing that may be.

Afterwards the cluster serves again by itself (no broker restart): every acknowledged
record reads back from the live brokers at the offset its delivery report gave, with
nothing duplicated; then once more after a cold restart.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.fixtures.etcd import EtcdProcess, start_etcd
from tests.fixtures.s3 import create_bucket
from tests.integration.logcheck import Backend, check_partition
from tests.integration.test_soak_zombies import PARTITIONS, SteadyProducer, verify, wait_rejoined
from tests.integration.zombie_cluster import FAST_MAINTENANCE, ZCluster, running

pytestmark = pytest.mark.integration


class Etcd:
    def __init__(self, tmp: Path) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.tmp = tmp
        self.proc: EtcdProcess = start_etcd(tmp)

    def freeze(self, seconds: float) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)  # the outage lasts this long, by the test's own schedule
        finally:
            os.kill(self.proc.pid, signal.SIGCONT)

    def kill_and_restart(self, down_s: float) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.stop()  # reaps it
        time.sleep(down_s)
        self.proc = start_etcd(self.tmp, self.proc.client_port, self.proc.peer_port)


@pytest.fixture
def outage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[ZCluster, Etcd]]:
    etcd = Etcd(tmp_path / "etcd")
    endpoint = request.getfixturevalue("seaweedfs_s3")
    bucket = create_bucket(endpoint)
    backend = Backend(
        "s3-etcd",
        endpoint.store_url(bucket, "kafscale"),
        etcd.proc.url,
        meta_prefix=f"/ko-{uuid.uuid4().hex[:8]}",
    )
    try:
        with running(ZCluster(tmp_path, backend)) as c:
            yield c, etcd
    finally:
        etcd.proc.stop()


def test_etcd_stalls_and_restarts_lose_nothing(outage: tuple[ZCluster, Etcd]) -> None:
    zc, etcd = outage
    for n in (1, 2, 3):
        zc.start(n, *FAST_MAINTENANCE)
    topic = "outage"
    admin = AdminClient({"bootstrap.servers": zc.brokers[1].bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS)])[topic].result(30)
    prod = SteadyProducer(",".join(b.bootstrap for b in zc.brokers.values()), topic)
    prod.start()
    time.sleep(1.0)
    etcd.freeze(8.0)  # longer than the brokers' leases (2 s)
    time.sleep(2.0)
    for _ in range(3):
        etcd.freeze(3.0)
        time.sleep(1.0)
    etcd.kill_and_restart(2.0)
    time.sleep(3.0)
    prod.pause()
    assert len(prod.acked) > 0
    wait_rejoined(zc, topic)
    verify(zc, topic, prod.acked)  # the live cluster, healed by itself
    zc.restart_all()
    verify(zc, topic, prod.acked)
    for p in range(PARTITIONS):
        check_partition(zc.backend, topic, p)
    logs = "\n".join(b.log_text() for b in zc.brokers.values())
    print(f"outage: {len(prod.acked)} records acknowledged")
    print(f"acknowledged without an offset: {sum(o == -1 for _p, o in prod.acked.values())}")
    print(f"commits of unknown outcome: {logs.count('outcome unknown')}")
    print(f"resolved: {logs.count(' resolved: ')}; still unknown: {logs.count('still unknown')}")
