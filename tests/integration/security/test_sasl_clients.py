"""Every client of the matrix over SASL_SSL (and mTLS) against a real broker: confluent-
kafka and kcat (librdkafka) with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512; kafka-python,
aiokafka and kafkajs with SCRAM. Each produces and consumes through the listener it
logged in on (Metadata and FindCoordinator advertise that listener's addresses)."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer

from tests.integration.security.conftest import MX, PASSWORDS, SecureBroker

pytestmark = pytest.mark.integration
TIMEOUT = 30.0
JS = Path(__file__).resolve().parent / "sasl_client.js"
JS_MODULES = Path(__file__).resolve().parents[1] / "js" / "node_modules"


def topic(tag: str) -> str:
    return f"{MX}{tag}-{uuid.uuid4().hex[:8]}"


def confluent_roundtrip(conf: dict[str, Any], name: str, n: int = 20) -> list[bytes | None]:
    p = Producer(conf)
    errors: list[object] = []
    for i in range(n):
        p.produce(name, f"v{i}".encode(), on_delivery=lambda e, m: errors.append(e) if e else None)
    assert p.flush(TIMEOUT) == 0 and not errors, errors
    c = Consumer({**conf, "group.id": f"{name}-g", "auto.offset.reset": "earliest"})
    try:
        c.subscribe([name])
        got: list[bytes | None] = []
        for _ in range(int(TIMEOUT * 2)):
            if len(got) >= n:
                break
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.value())
        return got
    finally:
        c.close()


@pytest.mark.parametrize("mech", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_confluent_sasl_ssl(secure_broker: SecureBroker, mech: str) -> None:
    name = topic(mech.lower())
    got = confluent_roundtrip(secure_broker.confluent("SASL_SSL", "app", mech), name)
    assert got == [f"v{i}".encode() for i in range(20)]


def test_confluent_mtls_principal_from_certificate(secure_broker: SecureBroker) -> None:
    """SSL listener, client certificate CN=app -> User:app (the mapping rule)."""
    pem = secure_broker.pki.client("app")
    conf = secure_broker.confluent(
        "SSL", **{"ssl.certificate.location": str(pem.cert), "ssl.key.location": str(pem.key)}
    )
    assert len(confluent_roundtrip(conf, topic("mtls"))) == 20
    # another certificate maps to User:eve, who has no ACLs: denied
    eve = secure_broker.pki.client("eve")
    conf = secure_broker.confluent(
        "SSL", **{"ssl.certificate.location": str(eve.cert), "ssl.key.location": str(eve.key)}
    )
    p = Producer(conf)
    errs: list[KafkaError | None] = []
    p.produce(topic("mtls-eve"), b"x", on_delivery=lambda e, m: errs.append(e))
    p.flush(TIMEOUT)
    first = errs[0] if errs else None
    assert first is not None and first.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


@pytest.mark.parametrize("mech", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kcat_sasl_ssl(secure_broker: SecureBroker, mech: str) -> None:
    kcat = shutil.which("kcat")
    if kcat is None:
        print("kcat not installed (scripts/setup.sh --test)")
        pytest.skip("kcat not installed")
    name = topic(f"kcat-{mech.lower()}")
    flags = [
        "-b", secure_broker.bootstrap("SASL_SSL"), "-X", "security.protocol=SASL_SSL",
        "-X", f"sasl.mechanisms={mech}", "-X", "sasl.username=app",
        "-X", f"sasl.password={PASSWORDS['app']}", "-X", f"ssl.ca.location={secure_broker.pki.ca}",
    ]  # fmt: skip
    lines = "".join(f"line-{i}\n" for i in range(10))
    r = subprocess.run([kcat, *flags, "-P", "-t", name], input=lines, capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = subprocess.run([kcat, *flags, "-C", "-t", name, "-o", "beginning", "-c", "10", "-e"],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [f"line-{i}" for i in range(10)]


def _ssl_context(sb: SecureBroker) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(sb.pki.ca))
    return ctx


@pytest.mark.parametrize("mech", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kafka_python_sasl_ssl(secure_broker: SecureBroker, mech: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka import KafkaConsumer, KafkaProducer
    common = dict(
        bootstrap_servers=secure_broker.bootstrap("SASL_SSL"), security_protocol="SASL_SSL",
        sasl_mechanism=mech, sasl_plain_username="app", sasl_plain_password=PASSWORDS["app"],
        ssl_cafile=str(secure_broker.pki.ca),
    )  # fmt: skip
    name = topic("kp")
    p = KafkaProducer(**common)
    for i in range(10):
        p.send(name, f"kp{i}".encode()).get(timeout=TIMEOUT)
    p.close()
    c = KafkaConsumer(name, group_id=f"{name}-g", auto_offset_reset="earliest",
                      consumer_timeout_ms=15000, **common)  # fmt: skip
    got = []
    for m in c:
        got.append(m.value)
        if len(got) == 10:
            break
    c.close()
    assert got == [f"kp{i}".encode() for i in range(10)]


@pytest.mark.parametrize("mech", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_aiokafka_sasl_ssl(secure_broker: SecureBroker, mech: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    name = topic("aio")

    async def run() -> list[bytes]:
        common = dict(
            bootstrap_servers=secure_broker.bootstrap("SASL_SSL"), security_protocol="SASL_SSL",
            sasl_mechanism=mech, sasl_plain_username="app",
            sasl_plain_password=PASSWORDS["app"], ssl_context=_ssl_context(secure_broker),
        )  # fmt: skip
        p = AIOKafkaProducer(**common)
        await p.start()
        try:
            for i in range(10):
                await p.send_and_wait(name, f"a{i}".encode())
        finally:
            await p.stop()
        c = AIOKafkaConsumer(name, group_id=f"{name}-g", auto_offset_reset="earliest", **common)
        await c.start()
        try:
            got: list[bytes] = []
            async with asyncio.timeout(TIMEOUT):
                async for m in c:
                    got.append(m.value)
                    if len(got) == 10:
                        break
            return got
        finally:
            await c.stop()

    assert asyncio.run(run()) == [f"a{i}".encode() for i in range(10)]


@pytest.mark.parametrize("mech", ["scram-sha-256", "scram-sha-512", "plain"])
def test_kafkajs_sasl_ssl(secure_broker: SecureBroker, mech: str) -> None:
    if shutil.which("node") is None or not (JS_MODULES / "kafkajs").exists():
        print("kafkajs test skipped: node or tests/integration/js/node_modules missing")
        pytest.skip("node or kafkajs missing")
    name = topic("js")
    r = subprocess.run(
        ["node", str(JS), secure_broker.bootstrap("SASL_SSL"), name, mech, "app",
         PASSWORDS["app"], str(secure_broker.pki.ca), "10"],
        capture_output=True, text=True, timeout=120, env={"NODE_PATH": str(JS_MODULES),
                                                           "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [f"js{i}" for i in range(10)]


def test_confluent_oauthbearer(secure_broker: SecureBroker) -> None:
    """OAUTHBEARER over SASL_SSL with a JWT signed by the JWKS's key (sub=app); a token
    signed by another key is refused."""
    from cryptography.hazmat.primitives.asymmetric import rsa

    signer = secure_broker.signer

    def good(_config: str) -> tuple[str, float]:
        token = signer.token("app", ttl=300)
        return token, __import__("time").time() + 300

    base = secure_broker.confluent("SASL_SSL", None)
    conf = {**base, "sasl.mechanisms": "OAUTHBEARER", "oauth_cb": good}
    assert len(confluent_roundtrip(conf, topic("oauth"))) == 20

    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    errors: list[KafkaError] = []

    def forged(_config: str) -> tuple[str, float]:
        return signer.token("app", key=other), __import__("time").time() + 300

    p = Producer({**base, "sasl.mechanisms": "OAUTHBEARER", "oauth_cb": forged,
                  "error_cb": errors.append, "message.timeout.ms": 5000})  # fmt: skip
    delivered: list[KafkaError | None] = []
    p.produce(topic("oauth-forged"), b"x", on_delivery=lambda e, m: delivered.append(e))
    p.flush(30)
    assert delivered and delivered[0] is not None  # never delivered
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors


def _served_cn(sb: SecureBroker) -> str:
    ctx = ssl.create_default_context(cafile=str(sb.pki.ca))
    import socket

    with socket.create_connection(("127.0.0.1", sb.ports["SASL_SSL"]), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            cert: Any = s.getpeercert()
    names = {k: v for rdn in cert["subject"] for k, v in rdn}
    return str(names["commonName"])


def test_certificate_reloaded_without_restart(secure_broker: SecureBroker) -> None:
    """Replacing the certificate files changes the certificate new connections get."""
    import time

    new_cn = f"renewed-{uuid.uuid4().hex[:6]}"
    assert _served_cn(secure_broker) != new_cn
    secure_broker.pki.reissue_server(new_cn)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _served_cn(secure_broker) != new_cn:
        time.sleep(0.2)
    assert _served_cn(secure_broker) == new_cn
    # and the renewed certificate serves clients as before
    assert len(confluent_roundtrip(secure_broker.confluent("SASL_SSL", "app"), topic("rl"))) == 20


# ---------------------------------------------------------------- mTLS and OAUTHBEARER
# for the other clients (the SSL listener maps CN=app to User:app)


def test_kcat_mtls(secure_broker: SecureBroker) -> None:
    kcat = shutil.which("kcat")
    if kcat is None:
        print("kcat not installed (scripts/setup.sh --test)")
        pytest.skip("kcat not installed")
    pem = secure_broker.pki.client("app")
    name = topic("kcat-mtls")
    flags = ["-b", secure_broker.bootstrap("SSL"), "-X", "security.protocol=SSL",
             "-X", f"ssl.ca.location={secure_broker.pki.ca}",
             "-X", f"ssl.certificate.location={pem.cert}",
             "-X", f"ssl.key.location={pem.key}"]  # fmt: skip
    r = subprocess.run([kcat, *flags, "-P", "-t", name], input="a\nb\n", capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = subprocess.run([kcat, *flags, "-C", "-t", name, "-o", "beginning", "-c", "2", "-e"],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0 and r.stdout.split() == ["a", "b"], r.stderr


def test_kafka_python_mtls_and_oauthbearer(secure_broker: SecureBroker) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka import KafkaConsumer, KafkaProducer
        from kafka.net.sasl.oauth import AbstractTokenProvider

    class Provider(AbstractTokenProvider):
        def token(self) -> str:
            return secure_broker.signer.token("app")

    pem = secure_broker.pki.client("app")
    variants: dict[str, dict[str, Any]] = {
        "mtls": dict(bootstrap_servers=secure_broker.bootstrap("SSL"), security_protocol="SSL",
                     ssl_cafile=str(secure_broker.pki.ca), ssl_certfile=str(pem.cert),
                     ssl_keyfile=str(pem.key)),
        "oauth": dict(bootstrap_servers=secure_broker.bootstrap("SASL_SSL"),
                      security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER",
                      sasl_oauth_token_provider=Provider(), ssl_cafile=str(secure_broker.pki.ca)),
    }  # fmt: skip
    for label, common in variants.items():
        name = topic(f"kp-{label}")
        p = KafkaProducer(**common)
        p.send(name, b"one").get(timeout=TIMEOUT)
        p.close()
        c = KafkaConsumer(name, group_id=f"{name}-g", auto_offset_reset="earliest",
                          consumer_timeout_ms=15000, **common)  # fmt: skip
        got = []
        for m in c:
            got.append(m.value)
            break
        c.close()
        assert got == [b"one"], label


def test_aiokafka_mtls_and_oauthbearer(secure_broker: SecureBroker) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.abc import AbstractTokenProvider

    class Provider(AbstractTokenProvider):
        async def token(self) -> str:
            return secure_broker.signer.token("app")

    pem = secure_broker.pki.client("app")
    mtls_ctx = _ssl_context(secure_broker)
    mtls_ctx.load_cert_chain(pem.cert, pem.key)
    variants = {
        "mtls": dict(bootstrap_servers=secure_broker.bootstrap("SSL"), security_protocol="SSL",
                     ssl_context=mtls_ctx),
        "oauth": dict(bootstrap_servers=secure_broker.bootstrap("SASL_SSL"),
                      security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER",
                      sasl_oauth_token_provider=Provider(),
                      ssl_context=_ssl_context(secure_broker)),
    }  # fmt: skip

    async def run(label: str, common: dict[str, object]) -> list[bytes]:
        name = topic(f"aio-{label}")
        p = AIOKafkaProducer(**common)
        await p.start()
        try:
            await p.send_and_wait(name, b"one")
        finally:
            await p.stop()
        c = AIOKafkaConsumer(name, group_id=f"{name}-g", auto_offset_reset="earliest", **common)
        await c.start()
        try:
            async with asyncio.timeout(TIMEOUT):
                async for m in c:
                    return [m.value]
        finally:
            await c.stop()
        return []

    for label, common in variants.items():
        assert asyncio.run(run(label, common)) == [b"one"], label


def test_kafkajs_mtls_and_oauthbearer(secure_broker: SecureBroker) -> None:
    if shutil.which("node") is None or not (JS_MODULES / "kafkajs").exists():
        print("kafkajs test skipped: node or tests/integration/js/node_modules missing")
        pytest.skip("node or kafkajs missing")
    pem = secure_broker.pki.client("app")
    env = {"NODE_PATH": str(JS_MODULES), "PATH": "/usr/bin:/bin"}
    for label, broker, mech, user, secret in (
        ("mtls", secure_broker.bootstrap("SSL"), "mtls", str(pem.cert), str(pem.key)),
        ("oauth", secure_broker.bootstrap("SASL_SSL"), "oauthbearer", "-",
         secure_broker.signer.token("app")),
    ):  # fmt: skip
        name = topic(f"js-{label}")
        r = subprocess.run(
            ["node", str(JS), broker, name, mech, user, secret, str(secure_broker.pki.ca), "3"],
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == ["js0", "js1", "js2"], label


def test_librdkafka_reauthenticates_kip368(secure_broker: SecureBroker) -> None:
    """An OAUTHBEARER token valid for 4 s makes the session last 4 s (it is shorter than
    --max-reauth-ms): librdkafka re-authenticates on its connections with new tokens,
    and producing across several lifetimes loses nothing. (Whether a connection of the
    client is ever cut for a request after its session ended depends on how fast the busy
    client re-authenticates, so it is not asserted here; the gate itself is unit-tested in
    tests/unit/broker/security/test_scram.py.)"""
    import time

    calls: list[float] = []

    def cb(_config: str) -> tuple[str, float]:
        calls.append(time.time())
        return secure_broker.signer.token("app", ttl=4), time.time() + 4

    conf = {**secure_broker.confluent("SASL_SSL", None), "sasl.mechanisms": "OAUTHBEARER",
            "oauth_cb": cb, "client.id": "kip368-client"}  # fmt: skip
    p = Producer(conf)
    name = topic("kip368")
    errors: list[object] = []
    end = time.monotonic() + 12
    sent = 0
    while time.monotonic() < end:
        p.produce(
            name, f"m{sent}".encode(), on_delivery=lambda e, m: errors.append(e) if e else None
        )
        sent += 1
        p.poll(0.1)
    assert p.flush(TIMEOUT) == 0 and not errors
    assert len(calls) >= 3  # new tokens for the re-authentications
    c = Consumer({**secure_broker.confluent("SASL_SSL", "app"), "group.id": f"{name}-g",
                  "auto.offset.reset": "earliest"})  # fmt: skip
    c.subscribe([name])
    got = 0
    deadline = time.monotonic() + TIMEOUT
    while got < sent and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got += 1
    c.close()
    assert got == sent
