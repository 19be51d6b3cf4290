"""Principal mapping rules, listener parsing, the broker's security flags, and TLS
contexts re-read when their files change."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.cli_broker import config_from_args
from broker.security.config import build_listeners, parse_protocol_map
from broker.security.tls import PrincipalMapper, ServerTls, peer_principal, subject_dn
from tests.fixtures.certs import make_pki

CERT = {
    "subject": (
        (("countryName", "US"),),
        (("organizationName", "acme, inc"),),
        (("organizationalUnitName", "eng"),),
        (("commonName", "alice"),),
    )
}


def test_subject_dn_is_rfc2253() -> None:
    assert subject_dn(CERT) == "CN=alice,OU=eng,O=acme\\, inc,C=US"


def test_mapping_rules() -> None:
    m = PrincipalMapper(r"RULE:^CN=(.*?),OU=(.*?),.*$/$1@$2/L, RULE:^CN=(.*)$/$1/U, DEFAULT")
    assert m.map("CN=Alice,OU=Eng,O=x,C=US") == "alice@eng"
    assert m.map("CN=bob") == "BOB"
    assert m.map("O=x") == "O=x"
    assert PrincipalMapper("RULE:^CN=(.*)$/$1/").map("O=x") is None  # no rule applies
    assert peer_principal(CERT, PrincipalMapper("DEFAULT")) == "User:" + subject_dn(CERT)
    assert peer_principal(None, PrincipalMapper()) is None
    with pytest.raises(ValueError):
        PrincipalMapper("RULE:broken")


def test_listeners() -> None:
    ls = build_listeners(
        ["PLAINTEXT://127.0.0.1:9092", "INTERNAL://0.0.0.0:9093", "SASL_SSL://[::]:9094"],
        ["SASL_SSL://kafka.example.com:443"],
        parse_protocol_map("INTERNAL:SSL"),
    )
    assert [(x.name, x.protocol, x.advertised_host, x.advertised_port) for x in ls] == [
        ("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 9092),
        ("INTERNAL", "SSL", "127.0.0.1", 9093),
        ("SASL_SSL", "SASL_SSL", "kafka.example.com", 443),
    ]
    for specs, adv in ((["FOO://h:1"], []), (["SSL://h:1", "SSL://h:2"], []),
                       (["SSL://h:1"], ["SASL_SSL://h:2"]), (["SSL://h"], [])):  # fmt: skip
        with pytest.raises(ValueError):
            build_listeners(specs, adv, {})


def test_broker_flags_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, _ = config_from_args(["--listen", "127.0.0.1:9092"])
    assert cfg.security.listeners == ()  # plain --listen: the legacy single listener
    monkeypatch.setenv("KAFSCALE_LISTENER", "SASL_SSL://0.0.0.0:9093,SSL://0.0.0.0:9094")
    monkeypatch.setenv("KAFSCALE_SUPER_USERS", "User:admin;User:ops")
    cfg, _ = config_from_args(
        ["--listen", "127.0.0.1:9092", "--advertised-listener", "SASL_SSL://ext:19093",
         "--ssl-cert", "c", "--ssl-key", "k", "--authorizer", "true"]
    )  # fmt: skip
    names = [(x.name, x.port, x.advertised_host) for x in cfg.security.listeners]
    assert names == [("PLAINTEXT", 9092, "127.0.0.1"), ("SASL_SSL", 9093, "ext"),
                     ("SSL", 9094, "127.0.0.1")]  # fmt: skip
    assert cfg.security.super_users == ("User:admin", "User:ops")
    assert cfg.security.authorizer
    with pytest.raises(SystemExit):
        config_from_args(["--listener", "PLAINTEXT://h:1", "--listen", "h:2"])


def test_tls_reload(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    tls = ServerTls(str(pki.server.cert), str(pki.server.key), str(pki.ca), "requested")
    first = tls.current
    assert not tls.maybe_reload(now=1e12)  # unchanged files: nothing to do
    pki.reissue_server("renewed")
    assert tls.maybe_reload(now=2e12) and tls.current is not first and tls.reloads == 1
    pki.server.key.write_text("garbage")  # half-written: the previous context stays
    current = tls.current
    assert not tls.maybe_reload(now=3e12) and tls.current is current
    with pytest.raises(ValueError):
        ServerTls(str(pki.server.cert), str(pki.server.key), None, "required")
