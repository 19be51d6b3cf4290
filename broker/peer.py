"""One Kafka request to a peer broker, over the Kafka protocol itself (for requests a
broker answers for partitions it owns, e.g. ElectLeaders forwarded to the owner).

The request is encoded with kafka-python's classes (request header v1, or v2 for flexible
versions) and the response decoded with them; each call opens and closes its own
connection: these requests are rare admin operations.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from protocol.apis import ApiKey, is_flexible
from protocol.codec import response_class

_SIZE = struct.Struct(">i")


class PeerError(Exception):
    """The peer could not be reached or answered something unreadable."""


async def call_peer(
    host: str, port: int, request: Any, version: int, client_id: str, timeout: float
) -> Any:
    """Send ``request`` at ``version`` to ``host:port`` and return the decoded response."""
    key = int(request.API_KEY)
    flexible = is_flexible(key, version)
    cid = client_id.encode()
    head = struct.pack(">hhih", key, version, 1, len(cid)) + cid + (b"\x00" if flexible else b"")
    body = head + bytes(request.encode(version=version))
    writer = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(_SIZE.pack(len(body)) + body)
            size = _SIZE.unpack(await reader.readexactly(4))[0]
            data = await reader.readexactly(size)
        skip = 5 if flexible and key != ApiKey.API_VERSIONS else 4
        return response_class(key).decode(data[skip:], version=version)
    except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError, struct.error) as exc:
        raise PeerError(f"{host}:{port}: {type(exc).__name__}: {exc}") from exc
    finally:
        if writer is not None:
            writer.close()
