"""SaslHandshake (key 17) v0-1 and SaslAuthenticate (key 36) v0-2
(docs/operations.md, "Security"; the state machine: ``broker.security.sasl``).

Handshake v1 is followed by SaslAuthenticate requests; v0 by bare SASL tokens in size-
prefixed frames without a request header (the connection handles those). A mechanism not
enabled on the listener gets UNSUPPORTED_SASL_MECHANISM with the enabled list; a
handshake on a non-SASL listener or in the middle of an exchange ILLEGAL_SASL_STATE.
A failed authentication answers SASL_AUTHENTICATION_FAILED and the connection closes.
v1+ responses carry the session lifetime (KIP-368; 0 = none).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.sasl import SaslAuthenticateResponse, SaslHandshakeResponse

from broker.handlers.registry import RequestContext
from broker.security.sasl import authenticate_step
from protocol.errors import ErrorCode


async def sasl_handshake(ctx: RequestContext, request: Any) -> Any:
    session = ctx.session
    mechanisms = list(session.mechanisms) if session is not None else []
    if session is None or not session.sasl:
        return SaslHandshakeResponse(
            error_code=int(ErrorCode.ILLEGAL_SASL_STATE), mechanisms=mechanisms
        )
    if session.mechanism is not None:
        session.fail()
        return SaslHandshakeResponse(
            error_code=int(ErrorCode.ILLEGAL_SASL_STATE), mechanisms=mechanisms
        )
    if not session.handshake(str(request.mechanism)):
        return SaslHandshakeResponse(
            error_code=int(ErrorCode.UNSUPPORTED_SASL_MECHANISM), mechanisms=mechanisms
        )
    if ctx.header.api_version == 0:
        session.raw_tokens = True
    return SaslHandshakeResponse(error_code=0, mechanisms=mechanisms)


async def sasl_authenticate(ctx: RequestContext, request: Any) -> Any:
    session = ctx.session
    security = getattr(ctx.broker, "security", None)
    if session is None or security is None or not session.sasl:
        return SaslAuthenticateResponse(
            error_code=int(ErrorCode.ILLEGAL_SASL_STATE),
            error_message="not a SASL listener",
            auth_bytes=b"",
            session_lifetime_ms=0,
        )
    token = bytes(request.auth_bytes or b"")
    res = await authenticate_step(session, security.credentials, security.jwt, token, ctx.peer)
    if res.error is not None:
        code = (
            ErrorCode.SASL_AUTHENTICATION_FAILED
            if session.mechanism_name or "Handshake" not in res.error
            else ErrorCode.ILLEGAL_SASL_STATE
        )
        return SaslAuthenticateResponse(
            error_code=int(code), error_message=res.error, auth_bytes=b"", session_lifetime_ms=0
        )
    return SaslAuthenticateResponse(
        error_code=0,
        error_message=None,
        auth_bytes=res.token,
        session_lifetime_ms=res.lifetime_ms,
    )
