"""Server TLS and mTLS principals (docs/operations.md, "Security").

:class:`ServerTls` builds the ``ssl.SSLContext`` of the SSL and SASL_SSL listeners from
certificate, key and CA files. The files are checked at most once a second, during a TLS
handshake (the server-name callback runs on every ClientHello, with or without SNI);
when one changed, a new context is loaded and used for that handshake and every later
one. A failed reload (a file half written) keeps the previous context and logs once.

:func:`peer_principal` maps a verified client certificate's subject, in RFC 2253 form
(``CN=alice,OU=eng,O=acme``), through Kafka's ``ssl.principal.mapping.rules``
(``RULE:pattern/replacement/[LU]`` ..., ``DEFAULT``) to ``User:<name>``.
"""

from __future__ import annotations

import logging
import os
import re
import ssl
import time
from typing import Any

log = logging.getLogger(__name__)

RELOAD_CHECK_S = 1.0
CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}

_SHORT = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
    "emailAddress": "EMAILADDRESS",
}


class ServerTls:
    """The TLS context of the broker's TLS listeners, re-read when its files change."""

    def __init__(
        self,
        cert: str,
        key: str,
        ca: str | None = None,
        client_auth: str = "none",
        key_password: str | None = None,
    ) -> None:
        if client_auth not in CLIENT_AUTH:
            raise ValueError(f"ssl client auth must be one of {sorted(CLIENT_AUTH)}")
        if client_auth != "none" and not ca:
            raise ValueError("client certificates need a CA file (--ssl-ca)")
        self.files = [f for f in (cert, key, ca) if f]
        self.cert, self.key, self.ca = cert, key, ca
        self.client_auth = client_auth
        self.key_password = key_password
        self._stamp = self._stamps()
        self.current = self._load()
        self.base = self._load()  # what the server was created with; swaps in current
        self.base.sni_callback = self._on_hello
        self._checked = time.monotonic()
        self.reloads = 0

    def _stamps(self) -> tuple[tuple[int, int], ...]:
        out = []
        for f in self.files:
            try:
                st = os.stat(f)
                out.append((st.st_mtime_ns, st.st_size))
            except OSError:
                out.append((0, 0))
        return tuple(out)

    def _load(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key, password=self.key_password)
        if self.ca:
            ctx.load_verify_locations(cafile=self.ca)
        ctx.verify_mode = CLIENT_AUTH[self.client_auth]
        return ctx

    def maybe_reload(self, now: float | None = None) -> bool:
        """Re-read the files when they changed (checked at most once a second)."""
        now = time.monotonic() if now is None else now
        if now - self._checked < RELOAD_CHECK_S:
            return False
        self._checked = now
        stamp = self._stamps()
        if stamp == self._stamp:
            return False
        try:
            ctx = self._load()
        except (OSError, ssl.SSLError, ValueError) as exc:
            log.warning("TLS files changed but do not load (%s); keeping the previous ones", exc)
            return False
        self._stamp = stamp
        self.current = ctx
        self.reloads += 1
        log.info("TLS certificate files changed: reloaded")
        return True

    def _on_hello(self, sslobj: Any, server_name: str | None, ctx: ssl.SSLContext) -> None:
        self.maybe_reload()
        if sslobj.context is not self.current:
            sslobj.context = self.current


# ------------------------------------------------------------------ principals


def _escape(value: str) -> str:
    out = re.sub(r'([,+"\\<>;=])', r"\\\1", value)
    if out.startswith((" ", "#")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


def subject_dn(peercert: dict[str, Any]) -> str:
    """The RFC 2253 distinguished name (last RDN first) of a decoded peer certificate."""
    rdns = []
    for rdn in reversed(peercert.get("subject", ())):
        rdns.append("+".join(f"{_SHORT.get(k, k)}={_escape(str(v))}" for k, v in rdn))
    return ",".join(rdns)


_RULE = re.compile(r"\s*(?:(DEFAULT)|RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?))\s*(?:,|$)")


class PrincipalMapper:
    """Kafka's ``ssl.principal.mapping.rules``: the first rule whose pattern matches the
    whole DN rewrites it (``$1`` groups; ``/L`` lower case, ``/U`` upper case); DEFAULT
    keeps the DN as it is."""

    def __init__(self, rules: str = "DEFAULT") -> None:
        self.rules: list[tuple[re.Pattern[str], str, str] | None] = []
        pos, text = 0, rules.strip() or "DEFAULT"
        while pos < len(text):
            m = _RULE.match(text, pos)
            if m is None or m.end() == pos:
                raise ValueError(f"invalid principal mapping rules at {text[pos:]!r}")
            pos = m.end()
            if m.group(1):
                self.rules.append(None)
                continue
            pattern = m.group(2).replace("\\/", "/")
            repl = re.sub(r"\$(\d+)", r"\\g<\1>", m.group(3).replace("\\/", "/"))
            self.rules.append((re.compile(pattern), repl, m.group(4)))

    def map(self, dn: str) -> str | None:
        for rule in self.rules:
            if rule is None:
                return dn
            pattern, repl, case = rule
            m = pattern.fullmatch(dn)
            if m is None:
                continue
            out = m.expand(repl)
            return out.lower() if case == "L" else out.upper() if case == "U" else out
        return None  # Kafka: no rule applies -> the connection is refused


def peer_principal(peercert: dict[str, Any] | None, mapper: PrincipalMapper) -> str | None:
    """``User:<mapped subject>`` of a verified client certificate, or None without one
    (or when no mapping rule applies)."""
    if not peercert or not peercert.get("subject"):
        return None
    name = mapper.map(subject_dn(peercert))
    return None if name is None else f"User:{name}"
