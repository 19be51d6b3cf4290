"""A zombie's shared object (docs/format.md, "Shared objects"): a broker frozen with a
flush cycle of two partitions built and not yet written, woken after another broker took
both partitions over and committed other records at the same offsets. Its late shared
object takes a name of its own, its commits are fenced (or never tried: it finds its
lease expired first), no producer of it is told its records were written, every
acknowledged record reads back (live and after a cold restart), and the shared sweep
deletes the zombie's object (every end it names moved to a new epoch).

Two broker processes share etcd and a store (a directory, or SeaweedFS); the harness is
tests/integration/zombie_cluster.py's.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from broker.cluster import BrokerInfo, rendezvous
from protocol.records import build_batch
from segments.store import open_store
from tests.integration import kafka_raw as kr
from tests.integration.logcheck import check_partition
from tests.integration.test_zombies import create, values
from tests.integration.zombie_cluster import FAST_MAINTENANCE, WAIT, ZCluster, assert_exactly

pytestmark = pytest.mark.integration

SHARED = ("--shared-objects-min-partitions", "2", "--shared-sweep-interval-ms", "300")


def owned_by_one(prefix: str) -> str:
    """A topic name both of whose two partitions hash to broker 1 of brokers 1 and 2."""
    infos = [BrokerInfo(n, "127.0.0.1", 0) for n in (1, 2)]
    for i in range(10_000):
        name = f"{prefix}-{i}"
        owners = [rendezvous(f"p\x00{name}\x00{p}", infos) for p in (0, 1)]
        if all(o is not None and o.node_id == 1 for o in owners):
            return name
    raise AssertionError("no such topic name")


def shared_of(zc: ZCluster, node: int) -> list[str]:
    async def listed() -> list[str]:
        store = open_store(zc.backend.store_url)
        try:
            return [i.key for i in await store.list("default/@shared/")]
        finally:
            await store.close()

    return [k for k in asyncio.run(listed()) if k.rsplit("/", 1)[1].startswith(f"{node}-")]


def test_zombie_shared_flush_woken_before_its_put(zc: ZCluster) -> None:
    zc.start(1, *FAST_MAINTENANCE, *SHARED, pause_at="flush.before_put")
    zc.start(2, *FAST_MAINTENANCE, *SHARED)
    topic = owned_by_one("shared-zombie")
    create(zc.brokers[2].bootstrap, topic, 2)
    late = kr.RawConn(zc.brokers[1].port, timeout=WAIT)
    request = kr.ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout_ms=10_000,
        topic_data=[(topic, [(p, build_batch([(None, b"ZOMBIE", None)])) for p in (0, 1)])],
    )
    try:
        # broker 1 takes both partitions (a fetch), so that one flush cycle takes the
        # request's two batches
        for p in (0, 1):
            assert kr.fetch_all(zc.brokers[1].port, topic, p).error_code == 0
        late.send(kr.request_bytes(request, 8, correlation_id=7))
        zc.wait_frozen_at_checkpoint(1, "flush.before_put")
        acked = {p: zc.produce(topic, p, values(f"b{p}", 5)) for p in (0, 1)}
        assert all(sorted(a.values()) == [0, 1, 2, 3, 4] for a in acked.values())
        zc.wake(1)
        data = late.recv_frame()
        if data is not None:  # an answer, if any, is an error, never an acknowledgement
            resp = kr.ProduceResponse.decode(data, version=8, header=True)
            assert all(p.error_code != 0 for p in resp.responses[0].partition_responses)
    finally:
        late.close()
    deadline = time.monotonic() + WAIT
    swept = "deleted 1 shared objects no entry names"  # only the zombie writes one here
    while shared_of(zc, 1) or not any(swept in b.log_text() for b in zc.brokers.values()):
        assert time.monotonic() < deadline, "the zombie's shared object was never swept"
        time.sleep(0.2)  # another process's store and log: polled
    for p in (0, 1):
        assert_exactly(zc.read(topic, p), acked[p])
        check_partition(zc.backend, topic, p)
    zc.restart_all()
    for p in (0, 1):
        assert_exactly(zc.read(topic, p), acked[p])
