"""The broker's HTTP endpoint (``--http HOST:PORT``), served by aiohttp:

- ``/healthz`` (liveness): 200 while the event loop keeps up; 503 when the lease
  keep-alive last woke more than ``LIVENESS_DELAY_S`` past its schedule (a starved loop;
  a wedged one does not answer at all, which the probe's timeout catches), or when a lease
  refresh has been in flight for ``KEEPALIVE_STUCK_S`` (a hung call: the lease would run
  out unnoticed). A metadata store outage does not fail it (each failed refresh returns
  within the store's timeout): restarting would not help;
- ``/readyz`` (readiness): 200 while the broker is registered and serving (started, and
  its lease confirmed by the metadata store), 503 otherwise;
- ``/metrics``: Prometheus (or OpenMetrics, by ``Accept``) text from :mod:`broker.metrics`
  (consumer-group figures are recomputed first, within ``GROUP_REFRESH_S``), rendered a
  chunk at a time between turns of the event loop;
- ``/registry/...``: the schema registry (Confluent REST API, :mod:`broker.registry.api`),
  behind HTTP Basic auth with ``--registry-auth basic`` (:mod:`broker.registry.auth`).

docs/operations.md, "Monitoring", has the probe settings.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Middleware

from broker.metrics import broker_registry, exposition_async
from broker.registry.api import RegistryApi

if TYPE_CHECKING:
    from broker.server import Broker

log = logging.getLogger(__name__)

TEXT = "text/plain"
SHUTDOWN_TIMEOUT_S = 2.0  # a scrape in progress at broker shutdown gets this long
GROUP_REFRESH_S = 5.0  # a scrape waits at most this long for the consumer-group figures
LIVENESS_DELAY_S = 5.0  # a keep-alive wake-up later than this: the loop is starved
KEEPALIVE_STUCK_S = 60.0  # a lease refresh in flight longer than this: it hangs


class HttpServer:
    """``start()`` binds and serves; ``stop()`` closes the listener and open requests."""

    def __init__(self, broker: Broker, hostport: str) -> None:
        host, _, port = hostport.rpartition(":")
        self.host = host.strip("[]") or "127.0.0.1"
        self.requested_port = int(port)
        self.broker = broker
        self.registry = broker_registry(broker)
        middlewares: list[Middleware] = []
        if broker.config.security.registry_auth == "basic":
            from broker.registry.auth import BasicAuth

            middlewares.append(BasicAuth(broker.security.credentials).middleware())
        app = web.Application(middlewares=middlewares)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        RegistryApi(broker.meta).add_routes(app)
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_TIMEOUT_S
        )
        self._site: web.TCPSite | None = None

    async def start(self) -> None:
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, self.host, self.requested_port)
        await self._site.start()
        log.info("http endpoint on %s:%d", self.host, self.port)

    @property
    def port(self) -> int:
        """The bound port (the requested one, or the one chosen for port 0)."""
        addresses = self._runner.addresses
        return int(addresses[0][1]) if addresses else self.requested_port

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def _healthz(self, _request: web.Request) -> web.Response:
        problem = liveness_problem(self.broker)
        if problem:
            return web.Response(status=503, text=problem + "\n", content_type=TEXT)
        return web.Response(text="ok\n", content_type=TEXT)

    async def _readyz(self, _request: web.Request) -> web.Response:
        if not self.broker.started.is_set():
            return web.Response(status=503, text="starting\n", content_type=TEXT)
        if not self.broker.cluster.lease_valid():
            return web.Response(status=503, text="lease not confirmed\n", content_type=TEXT)
        return web.Response(text="ready\n", content_type=TEXT)

    async def _metrics(self, request: web.Request) -> web.Response:
        try:
            async with asyncio.timeout(GROUP_REFRESH_S):
                await self.broker.group_metrics.refresh()
        except TimeoutError:
            log.warning("consumer-group metrics took over %.0f s; served the last", GROUP_REFRESH_S)
        body, content_type = await exposition_async(self.registry, request.headers.get("Accept"))
        return web.Response(body=body, headers={"Content-Type": content_type})


def liveness_problem(broker: Broker) -> str:
    """Why the broker's event loop looks starved or wedged ("" when it does not)."""
    _woke, delay = broker.log_metrics.last_keepalive
    since = broker.cluster.refresh_since
    stuck = asyncio.get_running_loop().time() - since if since is not None else 0.0
    return keepalive_problem(delay, stuck)


def keepalive_problem(late_s: float, stuck_s: float) -> str:
    """The liveness verdict: the keep-alive last woke ``late_s`` past its schedule (a
    starved loop), or its lease refresh has been in flight for ``stuck_s`` (a call that
    never returns: the lease would expire unnoticed and the broker never re-register;
    every store call is bounded far below ``KEEPALIVE_STUCK_S``, outages included)."""
    if late_s > LIVENESS_DELAY_S:
        return f"lease keep-alive woke {late_s:.1f} s late"
    if stuck_s > KEEPALIVE_STUCK_S:
        return f"lease refresh in flight for {stuck_s:.0f} s"
    return ""


async def start_http(broker: Broker, hostport: str) -> HttpServer:
    """Serve ``broker``'s probes and metrics on ``hostport``; stop with ``await .stop()``."""
    server = HttpServer(broker, hostport)
    await server.start()
    return server
