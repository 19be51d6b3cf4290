"""Which listener of a peer a forwarded request goes to, and how it logs in
(broker/security/inter_broker.py; the live path: tests/integration/security/
test_inter_broker.py)."""

from __future__ import annotations

import pytest

from broker.cluster import BrokerInfo
from broker.security.config import Listener, SecurityConfig
from broker.security.inter_broker import InterBrokerError, peer_target

PLAIN_ONLY = BrokerInfo(1, "10.0.0.1", 9092)
BOTH = BrokerInfo(
    1,
    "10.0.0.1",
    9093,
    endpoints=(("SASL_PLAINTEXT", "10.0.0.1", 9093), ("PLAINTEXT", "127.0.0.1", 9092)),
)
SASL_ONLY = BrokerInfo(1, "10.0.0.1", 9093, endpoints=(("INTERNAL", "10.0.0.1", 9093),))
LISTENERS = (Listener("INTERNAL", "SASL_SSL", "0.0.0.0", 9093, "10.0.0.1", 9093),)


def test_plaintext_only_peer_is_called_on_its_address() -> None:
    t = peer_target(SecurityConfig(), PLAIN_ONLY)
    assert (t.host, t.port, t.protocol, t.login) == ("10.0.0.1", 9092, "PLAINTEXT", None)


def test_plaintext_listener_preferred_when_not_named() -> None:
    t = peer_target(SecurityConfig(), BOTH)
    assert (t.host, t.port, t.login) == ("127.0.0.1", 9092, None)


def test_sasl_listener_logs_in_with_the_configured_user() -> None:
    cfg = SecurityConfig(
        listeners=LISTENERS, inter_broker_sasl_username="broker", inter_broker_sasl_password="pw"
    )
    t = peer_target(cfg, SASL_ONLY)
    assert (t.port, t.protocol) == (9093, "SASL_SSL")
    assert t.login is not None and (t.login.mechanism, t.login.username) == (
        "SCRAM-SHA-512",
        "broker",
    )
    assert "pw" not in repr(t.login)


def test_sasl_listener_without_credentials_names_the_flags() -> None:
    with pytest.raises(InterBrokerError, match="--inter-broker-sasl-username"):
        peer_target(SecurityConfig(listeners=LISTENERS), SASL_ONLY)


def test_named_listener_the_peer_lacks() -> None:
    with pytest.raises(InterBrokerError, match="no listener SSL"):
        peer_target(SecurityConfig(inter_broker_listener="SSL"), BOTH)
