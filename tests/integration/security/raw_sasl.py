"""SASL logins on raw test connections (``tests/integration/kafka_raw.RawConn``):
SaslHandshake v1 + SaslAuthenticate v2 with kafka-python's client-side mechanisms."""

from __future__ import annotations

from typing import Any

from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from tests.integration.kafka_raw import RawConn


def handshake(conn: RawConn, mechanism: str, cid: int = 1) -> Any:
    return conn.call(SaslHandshakeRequest(mechanism=mechanism), SaslHandshakeResponse, 1, cid)


def authenticate(conn: RawConn, token: bytes, cid: int = 2, version: int = 2) -> Any:
    req = SaslAuthenticateRequest(auth_bytes=token)
    return conn.call(req, SaslAuthenticateResponse, version, cid)


def login(conn: RawConn, user: str, password: str, mechanism: str = "SCRAM-SHA-256") -> Any:
    """Log ``conn`` in; returns the last SaslAuthenticate response (asserts success)."""
    assert handshake(conn, mechanism).error_code == 0
    if mechanism == "PLAIN":
        resp = authenticate(conn, f"\x00{user}\x00{password}".encode())
        assert resp.error_code == 0, resp
        return resp
    from kafka.net.sasl.scram import SaslMechanismScram

    client = SaslMechanismScram(
        sasl_mechanism=mechanism, sasl_plain_username=user, sasl_plain_password=password
    )
    cid, resp = 2, None
    while not client.is_done():
        resp = authenticate(conn, client.auth_bytes(), cid)
        assert resp.error_code == 0, resp
        client.receive(resp.auth_bytes)
        cid += 1
    assert client.is_authenticated()
    return resp
