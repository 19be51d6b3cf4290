"""Listeners and security settings (docs/operations.md, "Security").

A listener is ``NAME://HOST:PORT``. Its security protocol is the name itself when the
name is one of Kafka's protocols (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), else what
``--listener-security-protocol-map NAME:PROTOCOL,...`` says. Each listener is advertised
separately (``--advertised-listener NAME://HOST:PORT``; default: its own address, with a
wildcard host replaced by 127.0.0.1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.meta.etcd_secure import EtcdAuth

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
DEFAULT_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
WILDCARD_HOSTS = ("", "0.0.0.0", "::")


@dataclass(frozen=True, slots=True)
class Listener:
    name: str
    protocol: str
    host: str
    port: int
    advertised_host: str
    advertised_port: int

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")


def split_url(text: str) -> tuple[str, str, int]:
    """``NAME://HOST:PORT`` -> (NAME, HOST, PORT); ``[v6]`` hosts allowed."""
    name, sep, rest = text.strip().partition("://")
    if not sep or not name:
        raise ValueError(f"not NAME://HOST:PORT: {text!r}")
    host, colon, port = rest.rpartition(":")
    if not colon or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"not NAME://HOST:PORT: {text!r}")
    return name.upper(), host.strip("[]"), int(port)


def parse_protocol_map(text: str | None) -> dict[str, str]:
    """``INTERNAL:SSL,EXTERNAL:SASL_SSL`` -> {name: protocol}."""
    out: dict[str, str] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, sep, proto = item.strip().partition(":")
        proto = proto.upper()
        if not sep or proto not in PROTOCOLS:
            raise ValueError(f"not NAME:PROTOCOL with a protocol of {PROTOCOLS}: {item!r}")
        out[name.upper()] = proto
    return out


def build_listeners(
    specs: list[str], advertised: list[str], protocol_map: dict[str, str]
) -> tuple[Listener, ...]:
    """Listeners from ``--listener`` values and the ``NAME://`` ``--advertised-listener``
    values (matched by name)."""
    adv: dict[str, tuple[str, int]] = {}
    for text in advertised:
        name, host, port = split_url(text)
        adv[name] = (host, port)
    out: list[Listener] = []
    for text in specs:
        name, host, port = split_url(text)
        proto = protocol_map.get(name, name)
        if proto not in PROTOCOLS:
            raise ValueError(
                f"listener {name}: unknown security protocol (map it with "
                "--listener-security-protocol-map NAME:PROTOCOL)"
            )
        if any(x.name == name for x in out):
            raise ValueError(f"listener {name} given twice")
        ahost, aport = adv.get(name, (host if host not in WILDCARD_HOSTS else "127.0.0.1", port))
        out.append(Listener(name, proto, host, port, ahost, aport))
    unknown = set(adv) - {x.name for x in out}
    if unknown:
        raise ValueError(f"advertised listener(s) {sorted(unknown)} have no --listener")
    return tuple(out)


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    """Everything security-related; ``BrokerConfig.security`` (None: plaintext only)."""

    listeners: tuple[Listener, ...] = ()
    # TLS (every SSL / SASL_SSL listener)
    ssl_cert: str | None = None
    ssl_key: str | None = None
    ssl_key_password: str | None = field(default=None, repr=False)
    ssl_ca: str | None = None
    ssl_client_auth: str = "none"  # none | requested | required (Kafka's ssl.client.auth)
    principal_mapping_rules: str = "DEFAULT"
    # SASL
    sasl_mechanisms: tuple[str, ...] = DEFAULT_MECHANISMS
    auth_timeout_ms: int = 10_000  # unauthenticated SASL connections are closed after this
    max_reauth_ms: int = 0  # KIP-368 connections.max.reauth.ms (0: sessions never expire)
    # OAUTHBEARER (JWT) validation
    oauth_jwks: str | None = None  # file path or http(s) URL
    oauth_issuer: str | None = None
    oauth_audience: str | None = None
    oauth_principal_claim: str = "sub"
    # authorization
    authorizer: bool = False
    super_users: tuple[str, ...] = field(default_factory=tuple)
    allow_everyone_if_no_acl_found: bool = False
    # the schema registry on the HTTP port: none | basic (broker/registry/auth.py)
    registry_auth: str = "none"
    # how this broker logs in to its peers (forwarded ElectLeaders, broker/peer.py)
    inter_broker_listener: str | None = None
    inter_broker_sasl_mechanism: str = "SCRAM-SHA-512"
    inter_broker_sasl_username: str | None = None
    inter_broker_sasl_password: str | None = field(default=None, repr=False)
    # towards the backends: etcd over TLS and/or with a user (broker.meta.etcd_secure)
    etcd_ca: str | None = None
    etcd_cert: str | None = None
    etcd_key: str | None = None
    etcd_user: str | None = None
    etcd_password: str | None = field(default=None, repr=False)

    def etcd_auth(self) -> EtcdAuth | None:
        """The etcd connection options, or None for a plain etcd."""
        if not (self.etcd_ca or self.etcd_cert or self.etcd_user):
            return None
        from broker.meta.etcd_secure import EtcdAuth

        return EtcdAuth(
            self.etcd_user, self.etcd_password, self.etcd_ca, self.etcd_cert, self.etcd_key
        )
