"""SASL OAUTHBEARER (RFC 7628, Kafka's KIP-255) with JWT validation
(docs/operations.md, "Security").

The client's message is ``n,[a=authzid],\\x01auth=Bearer <JWT>\\x01[key=value\\x01]*\\x01``.
The token must be a JWS signed by a key of the JWKS (``--oauth-jwks``: a file, re-read
when it changes, or an http(s) URL, re-fetched at most every 5 minutes and when a token
names an unknown key id), with an asymmetric algorithm (RS*, PS*, ES*, EdDSA; never
``none`` or HMAC), not expired, and with the configured issuer and audience. The
principal is ``User:<claim>`` (``--oauth-principal-claim``, default ``sub``). The
session lifetime is the token's remaining validity, bounded by ``--max-reauth-ms``
and only applied when that is set (Kafka's rule).

Needs PyJWT and cryptography (``pip install 'kafscale[security]'``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
import urllib.request
from typing import Any

from broker.security.scram import SaslFailure

log = logging.getLogger(__name__)

ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384",
              "ES512", "EdDSA"]  # fmt: skip
URL_REFRESH_S = 300.0
UNKNOWN_KID_REFETCH_S = 5.0  # at most one fetch per this for tokens naming unknown keys
MAX_MESSAGE = 16384
INSTALL = "OAUTHBEARER needs PyJWT and cryptography: pip install 'kafscale[security]'"


def _jwt() -> Any:
    try:
        import jwt
    except ModuleNotFoundError:
        raise SystemExit(INSTALL) from None
    return jwt


class JwtValidator:
    def __init__(
        self,
        jwks: str | None,
        issuer: str | None,
        audience: str | None,
        principal_claim: str = "sub",
    ) -> None:
        if not jwks:
            raise ValueError("OAUTHBEARER needs --oauth-jwks")
        self.jwt = _jwt()
        self.source = jwks
        self.issuer = issuer
        self.audience = audience
        self.claim = principal_claim
        self._keys: dict[str | None, Any] = {}
        self._stamp: tuple[int, int] | None = None
        self._fetched = 0.0
        self._lock = threading.Lock()  # validate() runs in worker threads
        self._load(force=True)

    @property
    def _is_url(self) -> bool:
        return self.source.startswith(("http://", "https://"))

    def _read(self) -> dict[str, Any]:
        if self._is_url:
            with urllib.request.urlopen(self.source, timeout=10) as resp:  # noqa: S310
                return dict(json.loads(resp.read()))
        with open(self.source, "rb") as f:
            return dict(json.load(f))

    def _load(self, force: bool = False) -> None:
        """(Re-)read the JWKS when it may have changed; keeps the old keys on failure."""
        now = time.monotonic()
        if self._is_url:
            if not force and now - self._fetched < URL_REFRESH_S:
                return
            self._fetched = now
        else:
            try:
                st = os.stat(self.source)
                stamp = (st.st_mtime_ns, st.st_size)
            except OSError as exc:
                if force:
                    raise ValueError(f"cannot read JWKS {self.source}: {exc}") from None
                return
            if stamp == self._stamp and not force:
                return
            self._stamp = stamp
        try:
            doc = self._read()
            keys: dict[str | None, Any] = {}
            for jwk in doc.get("keys", []):
                try:
                    k = self.jwt.PyJWK(jwk)
                except self.jwt.PyJWTError:
                    continue
                if k.algorithm_name in ALGORITHMS:
                    keys[jwk.get("kid")] = k
        except (OSError, ValueError) as exc:
            if force and not self._keys:
                raise ValueError(f"cannot load JWKS {self.source}: {exc}") from None
            log.warning("JWKS reload failed (%s); keeping the previous keys", exc)
            return
        self._keys = keys

    def _key(self, kid: str | None) -> Any:
        with self._lock:
            self._load()
            if kid not in self._keys and self._is_url:
                self._load(force=time.monotonic() - self._fetched > UNKNOWN_KID_REFETCH_S)
        if kid in self._keys:
            return self._keys[kid]
        if kid is None and len(self._keys) == 1:
            return next(iter(self._keys.values()))
        raise SaslFailure("token signed by an unknown key")

    def validate(self, token: str) -> tuple[str, float]:
        """(principal name, expiry as epoch seconds) of a valid token."""
        jwt = self.jwt
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise SaslFailure("malformed token") from None
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            raise SaslFailure("token algorithm not accepted")
        key = self._key(header.get("kid"))
        if key.algorithm_name != alg:
            raise SaslFailure("token algorithm does not match its key")
        try:
            claims = jwt.decode(
                token,
                key.key,
                algorithms=[alg],
                audience=self.audience,
                issuer=self.issuer,
                options={"require": ["exp"], "verify_aud": self.audience is not None},
            )
        except jwt.ExpiredSignatureError:
            raise SaslFailure("token expired") from None
        except jwt.PyJWTError as exc:
            raise SaslFailure(f"invalid token ({type(exc).__name__})") from None
        name = claims.get(self.claim)
        if not isinstance(name, str) or not name:
            raise SaslFailure(f"token has no {self.claim!r} claim")
        return name, float(claims["exp"])


class OAuthBearerServer:
    def __init__(self, validator: JwtValidator) -> None:
        self.validator = validator
        self.done = False
        self.user = ""
        self.lifetime_ms = 0

    async def step(self, token: bytes) -> bytes:
        if self.done or len(token) > MAX_MESSAGE:
            raise SaslFailure("malformed OAUTHBEARER message")
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise SaslFailure("malformed OAUTHBEARER message") from None
        gs2, sep, rest = text.partition("\x01")
        parts = gs2.split(",")
        if not sep or len(parts) != 3 or parts[0] != "n" or parts[2] != "":
            raise SaslFailure("malformed OAUTHBEARER message")
        if not rest.endswith("\x01\x01"):
            raise SaslFailure("malformed OAUTHBEARER message")
        fields = dict(kv.partition("=")[::2] for kv in rest[:-2].split("\x01") if kv)
        auth = fields.get("auth", "")
        scheme, _, bearer = auth.partition(" ")
        if scheme.lower() != "bearer" or not bearer.strip():
            raise SaslFailure("malformed OAUTHBEARER message")
        # in a thread: a JWKS URL may be fetched, and signatures cost CPU
        name, exp = await asyncio.to_thread(self.validator.validate, bearer.strip())
        authzid = parts[1]
        if authzid and authzid != f"a={name}":
            raise SaslFailure("authorization id differs from the token's principal")
        self.user = name
        self.lifetime_ms = max(1, int((exp - time.time()) * 1000))
        self.done = True
        return b""
