"""How a broker reaches a peer for the requests it forwards (ElectLeaders to a partition's
owner; docs/operations.md "Inter-broker requests").

The peer's listener is ``--inter-broker-listener`` when given, else its ``PLAINTEXT``
listener when it has one, else its first (default) address. On an SSL/SASL_SSL listener
the connection trusts ``--ssl-ca`` (the system CAs without it) and presents the broker's
own ``--ssl-cert`` as its client certificate; on a SASL listener it logs in as
``--inter-broker-sasl-username`` with ``--inter-broker-sasl-mechanism``. That principal
is authorized by the peer like any client (ElectLeaders needs ALTER on the cluster):
make it a super user, as Kafka's broker principal usually is.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from broker.cluster import BrokerInfo
from broker.peer import PeerLogin
from broker.security.config import SecurityConfig

_STANDARD = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


class InterBrokerError(Exception):
    """The peer cannot be reached as configured; the message says why (safe to log)."""


@dataclass(frozen=True)
class PeerTarget:
    host: str
    port: int
    protocol: str
    login: PeerLogin | None


def peer_target(config: SecurityConfig, peer: BrokerInfo) -> PeerTarget:
    """Where and how to call ``peer`` (raises InterBrokerError)."""
    endpoints = {name: (host, port) for name, host, port in peer.endpoints}
    name = config.inter_broker_listener
    if name is None:
        if not peer.endpoints:
            return PeerTarget(peer.host, peer.port, "PLAINTEXT", None)
        name = "PLAINTEXT" if "PLAINTEXT" in endpoints else peer.endpoints[0][0]
    if name not in endpoints:
        raise InterBrokerError(f"broker {peer.node_id} has no listener {name}")
    host, port = endpoints[name]
    protocol = next((x.protocol for x in config.listeners if x.name == name), name)
    if protocol not in _STANDARD:
        raise InterBrokerError(f"unknown security protocol of listener {name}")
    login = None
    if protocol.startswith("SASL_"):
        user, password = config.inter_broker_sasl_username, config.inter_broker_sasl_password
        if not user or not password:
            raise InterBrokerError(
                f"listener {name} needs --inter-broker-sasl-username and -password"
            )
        login = PeerLogin(config.inter_broker_sasl_mechanism, user, password)
    return PeerTarget(host, port, protocol, login)


def client_tls(config: SecurityConfig) -> ssl.SSLContext:
    """The TLS context of a call to a peer's SSL/SASL_SSL listener (reads files: call it
    off the event loop)."""
    ctx = ssl.create_default_context(cafile=config.ssl_ca)
    if config.ssl_cert and config.ssl_key:
        ctx.load_cert_chain(config.ssl_cert, config.ssl_key, config.ssl_key_password)
    return ctx
