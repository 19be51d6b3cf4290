"""Bad input and abuse on the SASL listener of a live broker, which keeps serving its
authenticated clients throughout: requests before authentication, the authentication
deadline, malformed PLAIN and SCRAM tokens, wrong nonces and proofs, a SaslAuthenticate
without handshake, truncated frames, fuzzed tokens (hypothesis); then the log names the
user and address of a failure once and never a password. Also SaslHandshake v0 (bare
tokens) and KIP-368 re-authentication on the same connection."""

from __future__ import annotations

import struct
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from tests.integration.kafka_raw import RawConn, frame, header_v1
from tests.integration.security.conftest import MX, PASSWORDS, SecureBroker
from tests.integration.security.raw_sasl import authenticate, handshake, login

pytestmark = pytest.mark.integration
SASL_FAILED, ILLEGAL_STATE, UNSUPPORTED_MECH = 58, 34, 33
WRONG_PASSWORD = "not-the-password-" + uuid.uuid4().hex


def conn(sb: SecureBroker) -> RawConn:
    return RawConn(sb.ports["SASL_PLAINTEXT"], timeout=30)


def metadata_ok(c: RawConn, cid: int = 50) -> bool:
    req = MetadataRequest(topics=[], allow_auto_topic_creation=False)
    return c.call(req, MetadataResponse, 9, cid).cluster_id is not None


@pytest.fixture(scope="module")
def witness(secure_broker: SecureBroker) -> Iterator[RawConn]:
    """An authenticated connection that must keep working through every test."""
    c = conn(secure_broker)
    login(c, "app", PASSWORDS["app"], "SCRAM-SHA-512")
    yield c
    assert metadata_ok(c, 99)
    c.close()


@pytest.fixture(autouse=True)
def still_serving(secure_broker: SecureBroker, witness: RawConn) -> Iterator[None]:
    yield
    assert metadata_ok(witness)
    p = Producer(secure_broker.confluent("SASL_SSL", "app"))
    p.produce(f"{MX}alive", b"x")
    assert p.flush(30) == 0


def test_request_before_authentication_closes(secure_broker: SecureBroker) -> None:
    with conn(secure_broker) as c:
        c.send(_metadata_frame())
        assert c.closed_by_peer()
    with conn(secure_broker) as c:  # after a handshake, before authenticate: still refused
        assert handshake(c, "PLAIN").error_code == 0
        c.send(_metadata_frame())
        assert c.closed_by_peer()


def _metadata_frame() -> bytes:
    from tests.integration.kafka_raw import request_bytes

    return request_bytes(MetadataRequest(topics=None), 9, 7)


def test_unauthenticated_connection_closed_after_deadline(secure_broker: SecureBroker) -> None:
    with conn(secure_broker) as c:  # the broker's deadline is 3 s; we wait up to 30
        assert c.closed_by_peer()
    with conn(secure_broker) as c:  # a handshake alone does not extend it
        assert handshake(c, "SCRAM-SHA-256").error_code == 0
        assert c.closed_by_peer()


@pytest.mark.parametrize(
    "token",
    [b"", b"\x00app", b"\x00app\x00" + WRONG_PASSWORD.encode(), b"\xff" * 64,
     b"other\x00app\x00" + PASSWORDS["app"].encode(), b"\x00\x00\x00"],
)  # fmt: skip
def test_bad_plain_tokens_fail_and_close(secure_broker: SecureBroker, token: bytes) -> None:
    with conn(secure_broker) as c:
        assert handshake(c, "PLAIN").error_code == 0
        resp = authenticate(c, token)
        assert resp.error_code == SASL_FAILED and resp.auth_bytes == b""
        assert c.closed_by_peer()


def _scram_first(c: RawConn, nonce: str = "abcdefghijklmnop") -> str:
    assert handshake(c, "SCRAM-SHA-256").error_code == 0
    resp = authenticate(c, f"n,,n=app,r={nonce}".encode())
    assert resp.error_code == 0
    return resp.auth_bytes.decode()


@pytest.mark.parametrize("kind", ["proof", "nonce", "binding", "garbage", "truncated"])
def test_bad_scram_final(secure_broker: SecureBroker, kind: str) -> None:
    import base64

    with conn(secure_broker) as c:
        server_first = _scram_first(c)
        full = server_first.split(",")[0][2:]
        proof = base64.b64encode(b"\x00" * 32).decode()
        final = {
            "proof": f"c=biws,r={full},p={proof}",
            "nonce": f"c=biws,r={full}X,p={proof}",
            "binding": f"c=eSws,r={full},p={proof}",
            "garbage": "\x01\x02,,,=",
            "truncated": f"c=biws,r={full},p=",
        }[kind]
        resp = authenticate(c, final.encode(), 3)
        assert resp.error_code == SASL_FAILED
        assert c.closed_by_peer()


def test_authenticate_without_handshake(secure_broker: SecureBroker) -> None:
    with conn(secure_broker) as c:
        assert authenticate(c, b"\x00app\x00x").error_code == ILLEGAL_STATE
        assert c.closed_by_peer()


def test_unsupported_mechanism(secure_broker: SecureBroker) -> None:
    with conn(secure_broker) as c:
        resp = handshake(c, "GSSAPI")
        assert resp.error_code == UNSUPPORTED_MECH
        assert "SCRAM-SHA-512" in resp.mechanisms


def test_truncated_frames_close(secure_broker: SecureBroker) -> None:
    with conn(secure_broker) as c:  # SaslAuthenticate whose bytes field overruns the frame
        c.send(frame(header_v1(36, 1, 5) + struct.pack(">i", 1000) + b"abc"))
        assert c.closed_by_peer()
    with conn(secure_broker) as c:  # a handshake whose mechanism string is cut short
        c.send(frame(header_v1(17, 1, 6) + struct.pack(">h", 40) + b"SCR"))
        assert c.closed_by_peer()


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]), st.binary(max_size=200))
def test_fuzzed_tokens_never_authenticate(
    secure_broker: SecureBroker, mechanism: str, token: bytes
) -> None:
    with conn(secure_broker) as c:
        assert handshake(c, mechanism).error_code == 0
        resp = authenticate(c, token)
        if mechanism == "PLAIN" or resp.error_code:
            assert resp.error_code == SASL_FAILED
            assert c.closed_by_peer()
            return
        # a well-formed random client-first got server-first; a random final must fail
        resp = authenticate(c, token, 3)
        assert resp.error_code == SASL_FAILED


def test_failure_logged_once_without_secrets(secure_broker: SecureBroker) -> None:
    user = f"logcheck-{uuid.uuid4().hex[:6]}"
    with conn(secure_broker) as c:
        assert handshake(c, "PLAIN").error_code == 0
        token = f"\x00{user}\x00{WRONG_PASSWORD}".encode()
        assert authenticate(c, token).error_code == SASL_FAILED
        assert c.closed_by_peer()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and user not in secure_broker.proc.log_text():
        time.sleep(0.1)
    text = secure_broker.proc.log_text()
    lines = [line for line in text.splitlines() if user in line]
    assert len(lines) == 1 and "authentication failed" in lines[0] and "127.0.0.1:" in lines[0]
    assert WRONG_PASSWORD not in text
    assert all(pw not in text for pw in PASSWORDS.values())


def test_handshake_v0_bare_tokens(secure_broker: SecureBroker) -> None:
    from kafka.protocol.sasl import SaslHandshakeRequest, SaslHandshakeResponse

    with conn(secure_broker) as c:
        resp = c.call(SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, 0, 1)
        assert resp.error_code == 0
        c.send(frame(f"\x00app\x00{PASSWORDS['app']}".encode()))
        assert c.recv_frame() == b""  # PLAIN's empty answer, as a bare frame
        assert metadata_ok(c)


def test_session_lifetime_and_reauthentication(secure_broker: SecureBroker) -> None:
    with conn(secure_broker) as c:
        resp = login(c, "app", PASSWORDS["app"], "PLAIN")
        assert resp.session_lifetime_ms == 600000
        assert metadata_ok(c, 60)
        resp = login(c, "app", PASSWORDS["app"], "SCRAM-SHA-256")  # KIP-368 re-auth
        assert resp.session_lifetime_ms == 600000
        assert metadata_ok(c, 61)
        assert handshake(c, "PLAIN", 70).error_code == 0  # re-auth as someone else: refused
        resp = authenticate(c, f"\x00alice\x00{PASSWORDS['alice']}".encode(), 71)
        assert resp.error_code == SASL_FAILED
        assert c.closed_by_peer()


def test_large_frame_before_authentication_closes(secure_broker: SecureBroker) -> None:
    with conn(secure_broker) as c:  # announces 1 MiB before logging in
        c.send(struct.pack(">i", 1 << 20) + b"\x00" * 64)
        assert c.closed_by_peer()
