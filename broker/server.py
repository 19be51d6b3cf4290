"""The broker: composes the stores, cluster, topics, logs and groups, and serves TCP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

from broker import faults
from broker.admission import Admission
from broker.cluster import Cluster
from broker.config import BrokerConfig
from broker.connection import Connection
from broker.fetch_sessions import FetchSessionCache
from broker.gc_policy import GcPolicy
from broker.group_metrics import GroupMetrics
from broker.group_store import MetaGroupStore
from broker.handlers.routes import build_routes
from broker.heap_trim import HeapTrimmer
from broker.instrumented import InstrumentedMeta, InstrumentedStore
from broker.log_metrics import LogMetrics
from broker.logs import LogManager
from broker.meta.base import Compare, MetaStore, Put, open_meta
from broker.meta.schema import CLUSTER_ID_KEY, PRODUCER_ID_KEY
from broker.quotas import QuotaStore
from broker.request_metrics import RequestRecorder
from broker.security.acl import Operation, ResourceType
from broker.security.config import Listener
from broker.security.manager import SecurityManager
from broker.security.sasl import ANONYMOUS
from broker.telemetry import Telemetry
from broker.topics import TopicManager
from broker.txn_coordinator import TxnCoordinator
from broker.txn_markers import MarkerWriter
from groupcoord import GroupConfig, GroupCoordinator
from groupcoord.consumer_model import consumer_group_config
from segments.store import ObjectStore, open_store

if TYPE_CHECKING:
    from broker.http import HttpServer

log = logging.getLogger(__name__)

PRODUCER_ID_BLOCK = 1000


class ProducerIds:
    """Producer ids handed out in blocks from ``/producers/next-id`` (compare-and-set)."""

    def __init__(self, meta: MetaStore) -> None:
        self.meta = meta
        self._next = 0
        self._end = 0
        self._lock = asyncio.Lock()

    async def allocate(self) -> int:
        async with self._lock:
            if self._next >= self._end:
                await self._new_block()
            pid = self._next
            self._next += 1
            return pid

    async def _new_block(self) -> None:
        key = PRODUCER_ID_KEY
        while True:
            kv = await self.meta.get(key)
            start = int(kv.value) if kv is not None else 0
            guard = Compare(key, "mod_revision", "==", kv.mod_revision if kv else 0)
            end = start + PRODUCER_ID_BLOCK
            res = await self.meta.txn([guard], [Put(key, str(end).encode())])
            if res.succeeded:
                self._next, self._end = start, end
                return


class Broker:
    """A broker over the metadata store ``meta`` and object store ``store`` it is given
    (``from_config`` opens them from the configured URLs)."""

    def __init__(
        self,
        config: BrokerConfig,
        meta: MetaStore | None = None,
        store: ObjectStore | None = None,
    ) -> None:
        self.config = config
        # metrics (docs/operations.md): the stores are timed at their boundary
        self.telemetry = Telemetry()
        self.meta: MetaStore = InstrumentedMeta(
            meta
            if meta is not None
            else open_meta(
                config.meta_url,
                config.data_dir,
                config.meta_prefix,
                etcd_auth=config.security.etcd_auth(),
            ),
            self.telemetry,
        )
        self.store: ObjectStore = InstrumentedStore(
            store if store is not None else open_store(config.store_url), self.telemetry
        )
        self.routes = build_routes()
        self.requests = RequestRecorder(
            self.telemetry, enabled=config.request_metrics, routes=self.routes
        )
        self.log_metrics = LogMetrics(self.telemetry)
        self.cluster: Cluster = Cluster(self.meta, config)
        self.topics: TopicManager = TopicManager(
            self.meta, config, store=self.store, namespace=config.namespace
        )
        self.logs: LogManager = LogManager(
            config, self.meta, self.store, self.cluster, self.topics, self.log_metrics
        )
        self.cluster.on_keepalive = self.log_metrics.keepalive_delay
        self.group_metrics = GroupMetrics(self, config.lag_metrics_max_partitions)
        self.producer_ids = ProducerIds(self.meta)
        self.quotas = QuotaStore(self.meta)  # client quotas (issue 12)
        self.fetch_sessions = FetchSessionCache(config.max_fetch_sessions)  # KIP-227
        self.groups: GroupCoordinator | None = None
        self.txns: TxnCoordinator | None = None
        self.markers: MarkerWriter | None = None
        self.cluster_id = config.cluster_id
        self.connections: set[Connection] = set()
        self.admission: Admission = Admission(
            config.connection_inflight_bytes,
            config.broker_inflight_bytes,
            config.queued_max_request_bytes,
        )
        self.security = SecurityManager(config.security, self.meta)
        self._server: asyncio.Server | None = None
        self._servers: dict[str, asyncio.Server] = {}  # listener name -> server
        self._http: HttpServer | None = None
        self.started = asyncio.Event()

    # -- lifecycle ----------------------------------------------------------------------
    @classmethod
    def from_config(cls, config: BrokerConfig) -> Broker:
        return cls(config)

    async def start(self) -> None:
        faults.arm_from_env()
        if self.config.http:  # first: /healthz answers (and /readyz says 503) while starting
            from broker.http import start_http

            self._http = await start_http(self, self.config.http)
        try:
            # bound first, served last: a broker whose port another process listens on
            # exits before it writes anything (registered, it would be handed partitions
            # until its lease ran out)
            await self._bind()
            self.cluster_id = await self._cluster_id()
            await self.cluster.start()
            await self.topics.start()
            await self.quotas.start()
            await self.logs.start()
            self.groups = await self._start_groups()
            await self.security.start()
            self._start_transactions()
            faults.checkpoint("start.before_serving")
            for server in self._kafka_servers():
                await server.start_serving()
            await self.cluster.serve()  # placed partitions and groups from here on
        except BaseException:
            for server in self._kafka_servers():
                server.close()
            raise
        self.started.set()

    def _kafka_servers(self) -> list[asyncio.Server]:
        if self._servers:  # named listeners (self._server is the first of them)
            return list(self._servers.values())
        return [self._server] if self._server is not None else []

    async def _bind(self) -> None:
        """Bind every Kafka listener, not yet listening: until ``start_serving`` a client
        is refused (and tries another broker) rather than left waiting in a backlog."""
        loop = asyncio.get_running_loop()
        if not self.config.security.listeners:
            self._server = await loop.create_server(
                lambda: Connection(self),
                self.config.listen_host,
                self.config.listen_port,
                reuse_address=True,
                backlog=1024,
                start_serving=False,
            )
        for listener in self.config.security.listeners:
            self._servers[listener.name] = await self._listen(loop, listener)
        if self._server is None:
            self._server = next(iter(self._servers.values()))

    async def _listen(self, loop: asyncio.AbstractEventLoop, listener: Listener) -> asyncio.Server:
        recorder = RequestRecorder(
            self.telemetry,
            listener=listener.name.lower(),
            enabled=self.config.request_metrics,
            routes=self.routes,
        )
        return await loop.create_server(
            lambda: Connection(self, listener, recorder),
            listener.host,
            listener.port,
            ssl=self.security.ssl_context(listener),
            reuse_address=True,
            backlog=1024,
            start_serving=False,
        )

    def listener_port(self, name: str) -> int:
        """The bound port of listener ``name``."""
        return int(self._servers[name].sockets[0].getsockname()[1])

    def _topic_describable(self) -> Callable[[str, str, str], bool] | None:
        """(principal, host, topic) -> DESCRIBE allowed, for KIP-848 regex subscriptions;
        None without an authorizer."""
        authorizer = self.security.authorizer
        if authorizer is None:
            return None

        def describable(principal: str, host: str, topic: str) -> bool:
            return authorizer.authorize(
                principal or ANONYMOUS, host, Operation.DESCRIBE, ResourceType.TOPIC, topic
            )

        return describable

    async def _start_groups(self) -> GroupCoordinator:
        coordinator = GroupCoordinator(
            MetaGroupStore(self.meta),
            GroupConfig.from_broker(self),
            owns_group=self.cluster.owns_group,
            consumer_topics=self.topics,
            consumer_config=consumer_group_config(self.config, self._topic_describable()),
        )
        self.cluster.add_listener(coordinator.drop_unowned)
        await coordinator.start()
        return coordinator

    def _start_transactions(self) -> None:
        """The transaction coordinator and the marker writer (docs/architecture.md)."""
        self.txns = TxnCoordinator(
            self.meta,
            self.cluster,
            self.producer_ids,
            self.config.transaction_max_timeout_ms,
            self.config.transactional_id_expiration_ms,
        )
        self.txns.start()
        self.markers = MarkerWriter(self.meta, self.logs, self.cluster)
        self.markers.start()

    async def _cluster_id(self) -> str:
        key = CLUSTER_ID_KEY
        proposed = json.dumps({"id": BrokerConfig.new_cluster_id()}).encode()
        res = await self.meta.txn([Compare(key, "create_revision", "==", 0)], [Put(key, proposed)])
        kv = await self.meta.get(key) if not res.succeeded else None
        value = kv.value if kv is not None else proposed
        return str(json.loads(value)["id"])

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        await self.cluster.withdraw()  # the others place its partitions and groups now
        faults.checkpoint("stop.after_withdraw")
        if self._server is not None:
            self._server.close()
        for server in self._servers.values():
            server.close()
        for conn in list(self.connections):
            conn.close()
        if self._http is not None:
            await self._http.stop()
        if self.groups is not None:
            with contextlib.suppress(Exception):
                await self.groups.stop()
        await self.security.stop()
        for part in (self.txns, self.markers):
            if part is not None:
                with contextlib.suppress(Exception):
                    await part.stop()
        await self.logs.stop()
        await self.quotas.stop()
        await self.topics.stop()
        await self.cluster.stop()
        await self.meta.close()
        await self.store.close()


_SECRET_PARAM = re.compile(r"((?:secret_key|session_token)=)[^&]*")


def _redact(url: str) -> str:
    """``url`` with credential query parameters masked, for the log."""
    return _SECRET_PARAM.sub(r"\1***", url)


#: Kafka clients' default delivery.timeout.ms: producer ids should outlive it by far
CLIENT_DELIVERY_TIMEOUT_MS = 120_000


def _install_stop_signals(broker: Broker) -> asyncio.Event:
    """The event SIGTERM and SIGINT set. Installed before the broker starts (its listeners
    accept connections before its start returns): a signal while it starts stops it
    cleanly once it has started. A second signal while it still starts is the signal's
    default action (the process ends at once, as it did before it was asked to stop)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if stop.is_set() and not broker.started.is_set():
            log.warning("%s again while starting: exiting at once", sig.name)
            loop.remove_signal_handler(sig)
            signal.signal(sig, signal.SIG_DFL)  # SIGINT's would be KeyboardInterrupt
            signal.raise_signal(sig)
            return
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    return stop


async def serve(config: BrokerConfig) -> None:
    """Run a broker until SIGTERM/SIGINT, then shut down cleanly (flush + release)."""
    broker = Broker(config)
    stop = _install_stop_signals(broker)
    await broker.start()
    gc_policy = GcPolicy(config.gc_thaw_interval_s) if config.gc_thaw_interval_s > 0 else None
    if gc_policy is not None:
        log.debug("%d start-up objects frozen for the garbage collector", gc_policy.install())
        thaws = asyncio.create_task(gc_policy.run(), name="gc-thaws")
    trimmer = HeapTrimmer.load() if config.heap_trim_interval_ms > 0 else None
    if trimmer is not None:
        trims = asyncio.create_task(
            trimmer.run(config.heap_trim_interval_ms / 1000), name="heap-trims"
        )
    log.info(
        "kafscale broker %d serving %s:%d (advertised %s:%d), store %s, metadata %s",
        config.node_id,
        config.listen_host,
        broker.port,
        config.advertised_host,
        config.advertised_port,
        _redact(config.store_url),
        _redact(config.meta_url),
    )
    if 0 < config.producer_id_expiration_ms < CLIENT_DELIVERY_TIMEOUT_MS:
        log.warning(
            "--producer-id-expiration-ms %d is below the clients' default delivery.timeout.ms"
            " (%d): a producer may be forgotten while a failed request of it still waits for"
            " its retry, and a later batch of it accepted past the gap",
            config.producer_id_expiration_ms,
            CLIENT_DELIVERY_TIMEOUT_MS,
        )
    for x in config.security.listeners:
        log.info(
            "listener %s (%s) on %s:%d, advertised %s:%d",
            x.name,
            x.protocol,
            x.host,
            broker.listener_port(x.name),
            x.advertised_host,
            x.advertised_port,
        )
    await stop.wait()
    log.info("shutting down: flushing buffers and releasing partitions")
    if gc_policy is not None:
        thaws.cancel()  # what is frozen stays so: a thaw now would be one long pause
    if trimmer is not None:
        trims.cancel()
    await broker.stop()
