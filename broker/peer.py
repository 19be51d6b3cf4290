"""One Kafka request to a peer broker, over the Kafka protocol itself (for requests a
broker answers for partitions it owns, e.g. ElectLeaders forwarded to the owner).

The request is encoded with kafka-python's classes (request header v1, or v2 for flexible
versions) and the response decoded with them; each call opens and closes its own
connection: these requests are rare admin operations. On a TLS and/or SASL listener the
connection is opened with the broker's own TLS settings and logs in with
``--inter-broker-sasl-*`` (:class:`PeerLogin`; docs/operations.md "Inter-broker requests").
"""

from __future__ import annotations

import asyncio
import ssl
import struct
from dataclasses import dataclass, field
from typing import Any

from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from protocol.apis import ApiKey, is_flexible
from protocol.codec import response_class

_SIZE = struct.Struct(">i")


class PeerError(Exception):
    """The peer could not be reached or answered something unreadable."""


@dataclass(frozen=True)
class PeerLogin:
    """How to log in to a peer's SASL listener (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)."""

    mechanism: str
    username: str
    password: str = field(repr=False)


async def _roundtrip(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    request: Any,
    version: int,
    client_id: str,
    correlation_id: int,
) -> Any:
    key = int(request.API_KEY)
    flexible = is_flexible(key, version)
    cid = client_id.encode()
    head = struct.pack(">hhih", key, version, correlation_id, len(cid)) + cid
    body = head + (b"\x00" if flexible else b"") + bytes(request.encode(version=version))
    writer.write(_SIZE.pack(len(body)) + body)
    size = _SIZE.unpack(await reader.readexactly(4))[0]
    data = await reader.readexactly(size)
    skip = 5 if flexible and key != ApiKey.API_VERSIONS else 4
    return response_class(key).decode(data[skip:], version=version)


async def _login(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, login: PeerLogin, cid: str
) -> None:
    """SaslHandshake v1 + SaslAuthenticate v2 exchanges, as a Kafka client does."""
    hs = await _roundtrip(
        reader, writer, SaslHandshakeRequest(mechanism=login.mechanism), 1, cid, 1
    )
    if hs.error_code:
        raise PeerError(f"SASL handshake refused ({hs.error_code}): {login.mechanism}")
    if login.mechanism == "PLAIN":
        token = f"\x00{login.username}\x00{login.password}".encode()
        resp = await _roundtrip(
            reader, writer, SaslAuthenticateRequest(auth_bytes=token), 2, cid, 2
        )
        if resp.error_code:
            raise PeerError(f"SASL login as {login.username} failed ({resp.error_code})")
        return
    from kafka.net.sasl.scram import SaslMechanismScram

    client = SaslMechanismScram(
        sasl_mechanism=login.mechanism,
        sasl_plain_username=login.username,
        sasl_plain_password=login.password,
    )
    corr = 2
    while not client.is_done():
        token = await asyncio.to_thread(client.auth_bytes)  # PBKDF2 off the event loop
        req = SaslAuthenticateRequest(auth_bytes=token)
        resp = await _roundtrip(reader, writer, req, 2, cid, corr)
        if resp.error_code:
            raise PeerError(f"SASL login as {login.username} failed ({resp.error_code})")
        client.receive(resp.auth_bytes)
        corr += 1
    if not client.is_authenticated():
        raise PeerError("the peer's SCRAM signature did not verify")


async def call_peer(
    host: str,
    port: int,
    request: Any,
    version: int,
    client_id: str,
    timeout: float,
    *,
    tls: ssl.SSLContext | None = None,
    login: PeerLogin | None = None,
) -> Any:
    """Send ``request`` at ``version`` to ``host:port`` and return the decoded response
    (over TLS with ``tls``, after a SASL login with ``login``)."""
    writer = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port, ssl=tls)
            if login is not None:
                await _login(reader, writer, login, client_id)
            return await _roundtrip(reader, writer, request, version, client_id, 100)
    except PeerError:
        raise
    except Exception as exc:  # network, TLS, decoding, or a SCRAM exchange the client refused
        raise PeerError(f"{host}:{port}: {type(exc).__name__}: {exc}") from exc
    finally:
        if writer is not None:
            writer.close()
