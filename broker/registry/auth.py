"""HTTP Basic authentication of the schema registry (``--registry-auth basic``,
docs/registry.md "Authentication").

Every request under ``/registry`` must carry ``Authorization: Basic base64(user:password)``,
checked as a SASL/PLAIN login is (``broker.security.sasl.verify_plain``): against the
user's stored SCRAM-SHA-256 credential, else its SCRAM-SHA-512 one, with PBKDF2 run off
the event loop; an unknown user costs the same PBKDF2 as a wrong password. Anything else
answers HTTP 401 with the registry's error body (``{"error_code": 40101, ...}``) and a
``WWW-Authenticate`` challenge. A password that verified is remembered (by a keyed
digest, never the password) together with the exact credential it matched, so repeated
requests skip PBKDF2 until the credential changes. Authenticated users may use every
registry endpoint (there are no registry ACLs).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from broker.meta.base import MetaStoreError
from broker.registry.api import CONTENT_TYPE, PREFIX
from broker.security.sasl import verify_plain
from broker.security.scram import HASHES, ScramCredential
from broker.security.store import CredentialStore

log = logging.getLogger(__name__)

REALM = "kafscale-registry"
MAX_CACHE = 1024
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _reply(status: int, code: int, message: str, challenge: bool = False) -> web.Response:
    headers = {"Content-Type": CONTENT_TYPE}
    if challenge:
        headers["WWW-Authenticate"] = f'Basic realm="{REALM}"'
    body = json.dumps({"error_code": code, "message": message}).encode()
    return web.Response(status=status, body=body, headers=headers)


def parse_basic(header: str | None) -> tuple[str, bytes] | None:
    """(user, password) of an ``Authorization: Basic ...`` header, or None."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic" or not token:
        return None
    try:
        raw = base64.b64decode(token.strip(), validate=True)
        user_b, sep, password = raw.partition(b":")
        user = user_b.decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    if not sep or not user or not password:
        return None
    return user, password


class BasicAuth:
    """Checks Basic credentials against the SCRAM credential store."""

    def __init__(self, credentials: CredentialStore) -> None:
        self.credentials = credentials
        self._key = os.urandom(32)
        self._verified: dict[tuple[str, bytes], ScramCredential] = {}

    async def check(self, user: str, password: bytes) -> bool:
        digest = hmac.new(self._key, password, hashlib.sha256).digest()
        cached = self._verified.get((user, digest))
        if cached is not None:
            for mechanism in HASHES:  # the credential a PLAIN login would check now
                cred = await self.credentials.scram(user, mechanism)
                if cred is not None:
                    if cred == cached:
                        return True
                    break
        cred = await verify_plain(self.credentials, user, password)
        if cred is None:
            return False
        if len(self._verified) >= MAX_CACHE:
            self._verified.clear()
        self._verified[(user, digest)] = cred
        return True

    def middleware(self) -> Middleware:
        @web.middleware
        async def basic_auth(request: web.Request, handler: _Handler) -> web.StreamResponse:
            path = request.path
            if path != PREFIX and not path.startswith(PREFIX + "/"):
                return await handler(request)
            creds = parse_basic(request.headers.get("Authorization"))
            if creds is None:
                return _reply(401, 40101, "Unauthorized: HTTP Basic credentials needed", True)
            try:
                ok = await self.check(*creds)
            except MetaStoreError as exc:
                log.warning("registry auth: metadata store error: %s", exc)
                return _reply(500, 50001, "Error in the backend data store")
            if not ok:
                log.warning("registry: authentication failed for user %r from %s",
                            creds[0], request.remote)  # fmt: skip
                return _reply(401, 40101, "Unauthorized: invalid credentials", True)
            return await handler(request)

        return basic_auth
