"""One secured broker for the security suites: PLAINTEXT, SASL_PLAINTEXT, SASL_SSL and
SSL (client certificates required) listeners, the ACL authorizer on, ``User:admin`` a
super user. Users are created with ``kafscale users`` against the stopped embedded store
before the broker starts; the client-matrix ACLs with ``kafscale acls`` through the
admin API once it runs. Certificates are made in the test (``tests/fixtures/certs``)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.broker import BrokerProcess, free_port, start_broker
from tests.fixtures.certs import Pki, make_pki
from tests.fixtures.jwks import AUDIENCE, ISSUER, Signer, make_signer

PASSWORDS = {"admin": "admin-secret", "app": "app-secret", "alice": "alice-pw", "bob": "bob-pw"}
MX = "mx-"  # topics and groups of the client matrix: User:app may do anything under it


@dataclass
class SecureBroker:
    proc: BrokerProcess
    pki: Pki
    ports: dict[str, int]
    signer: Signer

    def bootstrap(self, listener: str) -> str:
        return f"127.0.0.1:{self.ports[listener]}"

    def confluent(self, listener: str, user: str | None = None, mech: str = "SCRAM-SHA-256",
                  password: str | None = None, **extra: Any) -> dict[str, Any]:  # fmt: skip
        """confluent-kafka settings for ``listener`` as ``user``."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap(listener)}
        proto = {"SASL_SSL": "SASL_SSL", "SASL_PLAINTEXT": "SASL_PLAINTEXT", "SSL": "SSL"}
        conf["security.protocol"] = proto.get(listener, "PLAINTEXT")
        if listener in ("SASL_SSL", "SSL"):
            conf["ssl.ca.location"] = str(self.pki.ca)
        if listener.startswith("SASL") and user is not None:
            conf.update({"sasl.mechanisms": mech, "sasl.username": user,
                         "sasl.password": password or PASSWORDS[user]})  # fmt: skip
        conf.update(extra)
        return conf


def kafscale(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker.cli", *args],
        capture_output=True, text=True, timeout=60, cwd=cwd,
    )  # fmt: skip


def admin_flags(sb: SecureBroker) -> list[str]:
    return ["--bootstrap", sb.bootstrap("SASL_PLAINTEXT"), "--security-protocol",
            "SASL_PLAINTEXT", "--sasl-mechanism", "SCRAM-SHA-512", "--sasl-username", "admin",
            "--sasl-password", PASSWORDS["admin"]]  # fmt: skip


@pytest.fixture(scope="session")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    root = tmp_path_factory.mktemp("secure")
    pki = make_pki(root / "pki")
    signer = make_signer(root / "jwks")
    workdir = root / "broker"
    for user, pw in PASSWORDS.items():
        r = kafscale("users", "--meta", "embedded", "--data-dir", str(workdir / "data"),
                     "create", user, "--password", pw)  # fmt: skip
        assert r.returncode == 0, r.stderr
    ports = {n: free_port() for n in ("SASL_PLAINTEXT", "SASL_SSL", "SSL")}
    args = [f"--listener={n}://127.0.0.1:{p}" for n, p in ports.items()]
    http = free_port()  # the schema registry, behind HTTP Basic auth
    args += ["--http", f"127.0.0.1:{http}", "--registry-auth", "basic"]
    args += ["--ssl-cert", str(pki.server.cert), "--ssl-key", str(pki.server.key),
             "--ssl-ca", str(pki.ca), "--ssl-client-auth", "requested",
             "--ssl-principal-mapping-rules", "RULE:^CN=([^,]*),.*$/$1/,DEFAULT",
             "--authorizer", "true", "--super-users", "User:admin",
             "--sasl-auth-timeout-ms", "3000", "--max-reauth-ms", "600000",
             "--sasl-mechanisms", "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512,OAUTHBEARER",
             "--oauth-jwks", str(signer.jwks), "--oauth-issuer", ISSUER,
             "--oauth-audience", AUDIENCE]  # fmt: skip
    proc = start_broker(workdir, extra_args=tuple(args))
    sb = SecureBroker(proc, pki, {"PLAINTEXT": proc.port, **ports, "HTTP": http}, signer)
    try:
        for kind, name in (("--topic", MX), ("--group", MX)):
            r = kafscale("acls", *admin_flags(sb), "add", "--allow-principal", "User:app",
                         "--operation", "All", kind, name, "--resource-pattern-type",
                         "prefixed")  # fmt: skip
            assert r.returncode == 0, r.stderr
        yield sb
    finally:
        proc.stop()
