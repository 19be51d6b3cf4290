"""An asyncio wire client for unit tests on an in-process broker: requests encoded by
kafka-python's classes, responses decoded with them at the request's version."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from protocol.codec import response_class

WAIT = 30.0  # generous: the machine is shared


class WireClient:
    def __init__(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.r, self.w, self.cid = r, w, 0

    @classmethod
    async def connect(cls, port: int) -> WireClient:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        return cls(r, w)

    async def call_raw(self, req: Any, version: int, client_id: str = "c") -> tuple[bytes, int]:
        """Send ``req`` at ``version``; the response body and the total frame size."""
        self.cid += 1
        flexible = bool(req.flexible_version_q(version))
        cid = client_id.encode()
        hdr = struct.pack(">hhih", req.API_KEY, version, self.cid, len(cid)) + cid
        if flexible:
            hdr += b"\x00"
        body = hdr + bytes(req.encode(version=version))
        self.w.write(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", await asyncio.wait_for(self.r.readexactly(4), WAIT))[0]
        data = await asyncio.wait_for(self.r.readexactly(size), WAIT)
        assert struct.unpack_from(">i", data)[0] == self.cid
        skip = 5 if flexible and req.API_KEY != 18 else 4
        return data[skip:], size + 4

    async def call(self, req: Any, version: int, client_id: str = "c") -> Any:
        body, _size = await self.call_raw(req, version, client_id)
        return response_class(req.API_KEY).decode(body, version=version)

    async def close(self) -> None:
        self.w.close()
        try:
            await self.w.wait_closed()
        except OSError:
            pass
