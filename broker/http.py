"""A tiny HTTP endpoint for probes and Prometheus: /healthz, /readyz, /metrics.

No framework: one asyncio server answering GET requests with short bodies.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.server import Broker

log = logging.getLogger(__name__)


def metrics_text(broker: Broker) -> str:
    logs = broker.logs
    lines = [
        "# TYPE kafscale_connections gauge",
        f"kafscale_connections {len(broker.connections)}",
        "# TYPE kafscale_inflight_bytes gauge",
        f"kafscale_inflight_bytes {broker.inflight}",
        "# TYPE kafscale_pending_bytes gauge",
        f"kafscale_pending_bytes {logs.pending_bytes}",
        "# TYPE kafscale_partitions_owned gauge",
        f"kafscale_partitions_owned {len(logs.logs)}",
        "# TYPE kafscale_topics gauge",
        f"kafscale_topics {len(broker.topics.all())}",
        "# TYPE kafscale_live_brokers gauge",
        f"kafscale_live_brokers {len(broker.cluster.brokers())}",
        "# TYPE kafscale_segment_cache_bytes gauge",
        f"kafscale_segment_cache_bytes {logs.cache.bytes}",
        "# TYPE kafscale_segment_cache_hits_total counter",
        f"kafscale_segment_cache_hits_total {logs.cache.hits}",
        "# TYPE kafscale_segment_cache_misses_total counter",
        f"kafscale_segment_cache_misses_total {logs.cache.misses}",
    ]
    for name, value in sorted(logs.stats.items()):
        lines += [f"# TYPE kafscale_{name}_total counter", f"kafscale_{name}_total {value}"]
    return "\n".join(lines) + "\n"


async def start_http(broker: Broker, hostport: str) -> asyncio.Server:
    host, _, port = hostport.rpartition(":")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
            while (await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b"\n", b""):
                pass
            parts = line.decode("latin-1").split()
            path = parts[1] if len(parts) > 1 else "/"
            status, body = "404 Not Found", "not found\n"
            if path == "/healthz":
                status, body = "200 OK", "ok\n"
            elif path == "/readyz":
                ready = broker.started.is_set()
                status, body = (
                    ("200 OK", "ready\n") if ready else ("503 Service Unavailable", "starting\n")
                )
            elif path == "/metrics":
                status, body = "200 OK", metrics_text(broker)
            data = body.encode()
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
                + data
            )
            await writer.drain()
        except (TimeoutError, ConnectionError) as exc:
            log.debug("http client went away: %s", exc)
        finally:
            writer.close()

    return await asyncio.start_server(handle, host or "127.0.0.1", int(port))
