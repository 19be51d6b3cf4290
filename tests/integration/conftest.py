"""Shared helpers for the client-compatibility suites (``test_clients_*.py``).

Broker processes come from ``tests/fixtures/broker.py``; these helpers only name topics
and create them through a real client (confluent-kafka's AdminClient over TCP).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.broker import BrokerProcess, free_port, start_broker
from tests.integration.zombie_cluster import zc  # noqa: F401 - the durability tests' fixture

TIMEOUT = 20.0
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


BACKENDS = ("local", "s3-etcd")


def backend_kwargs(request: pytest.FixtureRequest, backend: str) -> dict[str, Any]:
    """``start_broker`` arguments for a backend: ``local`` is the embedded default (local
    directory store, embedded metadata); ``s3-etcd`` is a real SeaweedFS S3 server plus a
    real etcd (fresh bucket and key prefix each call)."""
    if backend == "local":
        return {}
    from tests.fixtures.s3 import create_bucket

    s3 = request.getfixturevalue("seaweedfs_s3")
    etcd_url = request.getfixturevalue("etcd_url")
    bucket = create_bucket(s3)
    return {
        "store_url": s3.store_url(bucket, "kafscale"),
        "meta_url": etcd_url,
        "extra_args": ("--meta-prefix", f"/clients-{uuid.uuid4().hex[:8]}"),
    }


@pytest.fixture(scope="session")
def s3_etcd_broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    """One session broker on SeaweedFS S3 + etcd for the client tests run on both backends."""
    kwargs = backend_kwargs(request, "s3-etcd")
    b = start_broker(tmp_path_factory.mktemp("s3-etcd-broker"), **kwargs)
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(params=BACKENDS)
def any_broker(request: pytest.FixtureRequest) -> BrokerProcess:
    """The shared broker of each backend in turn."""
    name = "shared_broker" if request.param == "local" else "s3_etcd_broker"
    broker: BrokerProcess = request.getfixturevalue(name)
    return broker


def unique_topic(prefix: str) -> str:
    """A topic name no other test of the session uses (the shared broker outlives tests)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    """Create ``name`` with ``partitions`` partitions and wait for the broker's answer."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    (fut,) = admin.create_topics([NewTopic(name, partitions, 1)], request_timeout=TIMEOUT).values()
    fut.result(timeout=TIMEOUT)
    md = admin.list_topics(name, timeout=TIMEOUT)
    assert len(md.topics[name].partitions) == partitions


def payload(i: int, size: int) -> bytes:
    """``size`` bytes that differ per ``i`` and per position (so a misplaced slice shows)."""
    head = f"{i:08d}:".encode()
    body = (head * (size // len(head) + 1))[:size]
    return body


class DroppingProxy:
    """A TCP proxy in front of a broker that cuts the connection instead of forwarding
    every ``drop_every``-th Produce response: the broker has committed the batch but the
    client never hears so, and must retry it (the retry has to be deduplicated).

    Start the broker with ``--advertised-listener 127.0.0.1:<proxy.port>`` so that the
    clients' every connection goes through the proxy. With ``max_drops`` it stops dropping
    after that many; with ``hold_after_drop`` new connections wait after each drop until
    ``release()`` (so the test can restart the broker before the client retries).
    """

    def __init__(
        self,
        port: int,
        target_port: int,
        drop_every: int,
        max_drops: int | None = None,
        hold_after_drop: bool = False,
    ) -> None:
        self.port = port
        self.target_port = target_port
        self.drop_every = drop_every
        self.max_drops = max_drops
        self.hold_after_drop = hold_after_drop
        self.produce_responses = 0
        self.dropped = 0
        self.drop_seen = threading.Event()
        self._open = asyncio.Event()
        self._open.set()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dropping-proxy", daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def start(self) -> DroppingProxy:
        self._thread.start()
        assert self._started.wait(10), "proxy did not start"
        return self

    def release(self) -> None:
        """Let held connections through to the broker."""
        self._loop.call_soon_threadsafe(self._open.set)

    def stop(self) -> None:
        self.release()

        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._writers):
                w.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def serve() -> None:
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
            self._started.set()

        self._loop.run_until_complete(serve())
        self._loop.run_forever()
        tasks = asyncio.all_tasks(self._loop)
        for t in tasks:
            t.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        await self._open.wait()
        try:
            br, bw = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            cw.close()
            return
        self._writers.update((cw, bw))
        api_of: dict[int, int] = {}
        up = asyncio.ensure_future(self._upstream(cr, bw, api_of))
        try:
            await self._downstream(br, cw, api_of)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            up.cancel()
            for w in (cw, bw):
                w.close()
                self._writers.discard(w)

    @staticmethod
    async def _upstream(
        cr: asyncio.StreamReader, bw: asyncio.StreamWriter, api_of: dict[int, int]
    ) -> None:
        try:
            while True:
                head = await cr.readexactly(4)
                body = await cr.readexactly(struct.unpack(">i", head)[0])
                api_key, _ver, corr = struct.unpack_from(">hhi", body)
                api_of[corr] = api_key
                bw.write(head + body)
                await bw.drain()
        except (OSError, asyncio.IncompleteReadError):
            bw.close()

    async def _downstream(
        self, br: asyncio.StreamReader, cw: asyncio.StreamWriter, api_of: dict[int, int]
    ) -> None:
        while True:
            head = await br.readexactly(4)
            body = await br.readexactly(struct.unpack(">i", head)[0])
            (corr,) = struct.unpack_from(">i", body)
            if api_of.pop(corr, None) == 0:  # a Produce response
                self.produce_responses += 1
                limit = self.max_drops is None or self.dropped < self.max_drops
                if limit and self.produce_responses % self.drop_every == 0:
                    self.dropped += 1
                    if self.hold_after_drop:
                        self._open.clear()
                    self.drop_seen.set()
                    return  # the caller closes both sides: the response is lost
            cw.write(head + body)
            await cw.drain()


@contextlib.contextmanager
def broker_behind_dropping_proxy(
    workdir: Path, drop_every: int
) -> Iterator[tuple[BrokerProcess, DroppingProxy, str]]:
    """A broker (2 partitions per auto-created topic) that advertises a DroppingProxy in
    front of it, cutting every ``drop_every``-th Produce response after the commit.
    Yields (broker, proxy, bootstrap through the proxy); stops both by PID/handle."""
    proxy_port = free_port()
    b = start_broker(
        workdir,
        extra_args=(
            "--advertised-listener",
            f"127.0.0.1:{proxy_port}",
            "--default-partitions",
            "2",
        ),
    )
    proxy = DroppingProxy(proxy_port, b.port, drop_every=drop_every).start()
    try:
        yield b, proxy, f"127.0.0.1:{proxy_port}"
    finally:
        proxy.stop()
        b.stop()
