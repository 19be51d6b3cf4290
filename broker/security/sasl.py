"""The SASL side of a connection: one :class:`Session` per connection
(docs/operations.md, "Security").

States: on a SASL listener a connection starts unauthenticated; only ApiVersions,
SaslHandshake and SaslAuthenticate are served until a mechanism succeeds (anything else
closes the connection, as Kafka does). SaslHandshake picks the mechanism; each
SaslAuthenticate carries one token of it. A failure answers SASL_AUTHENTICATION_FAILED
and the connection closes after that answer. With a session lifetime (KIP-368,
``--max-reauth-ms`` or a JWT's expiry) the client re-authenticates on the same connection
before it ends, under the same principal; a request after the end closes the connection.

Non-SASL listeners: the principal is ``User:ANONYMOUS``, or on SSL with a verified
client certificate the mapped certificate subject.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Protocol

from broker.security.config import Listener
from broker.security.scram import (
    HASHES,
    SaslFailure,
    ScramCredential,
    ScramServer,
    check_password,
    unknown_user_credential,
)
from protocol.apis import ApiKey

if TYPE_CHECKING:
    from broker.security.oauth import JwtValidator

log = logging.getLogger(__name__)

ANONYMOUS = "User:ANONYMOUS"
PRE_AUTH_APIS = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})
MAX_PLAIN = 4096


class Credentials(Protocol):
    async def scram(self, user: str, mechanism: str) -> ScramCredential | None: ...


async def verify_plain(creds: Credentials, user: str, password: bytes) -> ScramCredential | None:
    """Check a PLAIN (or HTTP Basic) password against the user's SCRAM-SHA-256 credential,
    else its SCRAM-SHA-512 one: the credential it matched, or None. PBKDF2
    runs off the event loop (hashlib releases the GIL). An unknown user is checked against
    a credential no password matches, so that it costs the same PBKDF2 as a wrong
    password: the answer's timing does not tell whether the user exists."""
    for mechanism in HASHES:
        cred = await creds.scram(user, mechanism)
        if cred is not None:
            ok = await asyncio.to_thread(check_password, mechanism, cred, password)
            return cred if ok else None
    mechanism = next(iter(HASHES))
    await asyncio.to_thread(check_password, mechanism, unknown_user_credential(mechanism), password)
    return None


class Mechanism(Protocol):
    done: bool
    user: str
    lifetime_ms: int  # 0: no limit of its own

    async def step(self, token: bytes) -> bytes: ...


class PlainServer:
    """RFC 4616: ``[authzid] NUL authcid NUL passwd``, checked against the user's SCRAM
    credential (SHA-256, else SHA-512)."""

    def __init__(self, creds: Credentials) -> None:
        self.creds = creds
        self.done = False
        self.user = ""
        self.lifetime_ms = 0

    async def step(self, token: bytes) -> bytes:
        if self.done or len(token) > MAX_PLAIN:
            raise SaslFailure("malformed PLAIN message")
        parts = token.split(b"\x00")
        if len(parts) != 3 or not parts[1] or not parts[2]:
            raise SaslFailure("malformed PLAIN message")
        try:
            authzid, user = parts[0].decode(), parts[1].decode()
        except UnicodeDecodeError:
            raise SaslFailure("malformed PLAIN message") from None
        if authzid and authzid != user:
            raise SaslFailure("authorization id differs from the user name")
        self.user = user
        if await verify_plain(self.creds, user, parts[2]) is None:
            raise SaslFailure("invalid credentials")
        self.done = True
        return b""


class ScramMechanism:
    def __init__(self, creds: Credentials, mechanism: str) -> None:
        self.creds = creds
        self.server = ScramServer(mechanism)
        self.mechanism = mechanism
        self.done = False
        self.user = ""
        self.lifetime_ms = 0

    async def step(self, token: bytes) -> bytes:
        if self.server.state == "first":
            user = self.server.parse_first(token)
            self.user = user
            return self.server.server_first(await self.creds.scram(user, self.mechanism))
        out = self.server.final(token)
        self.done = True
        return out


class Session:
    """Authentication state of one connection."""

    def __init__(
        self,
        listener: Listener | None,
        principal: str = ANONYMOUS,
        mechanisms: tuple[str, ...] = (),
        max_reauth_ms: int = 0,
    ) -> None:
        self.listener = listener
        self.sasl = listener is not None and listener.sasl
        self.principal = principal
        self.authenticated = not self.sasl
        self.mechanisms = mechanisms
        self.max_reauth_ms = max_reauth_ms
        self.mechanism_name: str | None = None
        self.mechanism: Mechanism | None = None
        self.failed = False  # close the connection once the answer is written
        self.expires_at: float | None = None  # monotonic time the session ends
        self.raw_tokens = False  # SaslHandshake v0: tokens follow as bare frames

    @property
    def listener_name(self) -> str | None:
        return self.listener.name if self.listener is not None else None

    def permits(self, api_key: int, now: float | None = None) -> bool:
        """Whether a request of ``api_key`` may be served now (False: close)."""
        if self.failed:
            return False
        if api_key in PRE_AUTH_APIS:
            return True
        if not self.authenticated or self.mechanism is not None:
            return False  # before authentication, or mid re-authentication
        if self.expires_at is not None:
            return (time.monotonic() if now is None else now) < self.expires_at
        return True

    def handshake(self, mechanism: str) -> bool:
        """Choose the mechanism (False: not enabled here)."""
        if not self.sasl or mechanism not in self.mechanisms or self.mechanism is not None:
            return False
        self.mechanism_name = mechanism
        return True

    def start(self, creds: Credentials, jwt: JwtValidator | None) -> Mechanism | None:
        """The mechanism server for the handshake's choice (created on its first token)."""
        name = self.mechanism_name
        if self.mechanism is None and name is not None:
            if name == "PLAIN":
                self.mechanism = PlainServer(creds)
            elif name in HASHES:
                self.mechanism = ScramMechanism(creds, name)
            elif name == "OAUTHBEARER" and jwt is not None:
                from broker.security.oauth import OAuthBearerServer

                self.mechanism = OAuthBearerServer(jwt)
        return self.mechanism

    def succeeded(self, user: str, lifetime_ms: int) -> int:
        """Record a successful authentication; returns the session lifetime in ms (0:
        unlimited). Re-authentication must keep the principal."""
        principal = f"User:{user}"
        if self.authenticated and principal != self.principal:
            raise SaslFailure("re-authentication changed the principal")
        self.principal = principal
        self.authenticated = True
        self.mechanism = None
        self.mechanism_name = None
        # Kafka's rule: sessions end only with connections.max.reauth.ms set, then at
        # the earlier of it and the credential's own expiry (a token's)
        life = 0
        if self.max_reauth_ms > 0:
            life = min(x for x in (self.max_reauth_ms, lifetime_ms) if x > 0)
        self.expires_at = time.monotonic() + life / 1000 if life else None
        return life

    def fail(self) -> None:
        self.failed = True
        self.mechanism = None


class StepResult:
    __slots__ = ("token", "error", "lifetime_ms", "done")

    def __init__(self, token: bytes, error: str | None, lifetime_ms: int, done: bool) -> None:
        self.token, self.error, self.lifetime_ms, self.done = token, error, lifetime_ms, done


async def authenticate_step(
    session: Session, creds: Credentials, jwt: JwtValidator | None, token: bytes, peer: str
) -> StepResult:
    """Feed one client token to the session's mechanism. A failure marks the session
    failed (the connection closes after the answer) and is logged once, with the claimed
    user and the address, never the token."""
    mech = session.start(creds, jwt)
    if mech is None:
        session.fail()
        return StepResult(b"", "SaslAuthenticate without a SaslHandshake", 0, False)
    try:
        out = await mech.step(token)
        if not mech.done:
            return StepResult(out, None, 0, False)
        life = session.succeeded(mech.user, mech.lifetime_ms)
    except SaslFailure as exc:
        name = session.mechanism_name
        log.warning(
            "authentication failed: user %r from %s with %s: %s",
            mech.user[:256],
            peer,
            name,
            exc,
        )
        session.fail()
        return StepResult(b"", f"Authentication failed during authentication: {exc}", 0, False)
    log.debug("authenticated %s from %s", session.principal, peer)
    return StepResult(out, None, life, True)
