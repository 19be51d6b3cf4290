"""OAUTHBEARER: valid tokens pass; forged, expired, wrong issuer/audience, alg none,
HMAC with the public key, unknown kid and malformed messages fail."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.security.oauth import JwtValidator, OAuthBearerServer
from broker.security.scram import SaslFailure
from tests.fixtures.jwks import AUDIENCE, ISSUER, Signer, make_signer


@pytest.fixture(scope="module")
def signer(tmp_path_factory: pytest.TempPathFactory) -> Signer:
    return make_signer(tmp_path_factory.mktemp("jwks"))


def validator(signer: Signer) -> JwtValidator:
    return JwtValidator(str(signer.jwks), ISSUER, AUDIENCE)


def msg(token: str, authzid: str = "") -> bytes:
    a = f"a={authzid}" if authzid else ""
    return f"n,{a},\x01auth=Bearer {token}\x01\x01".encode()


def run(v: JwtValidator, message: bytes) -> OAuthBearerServer:
    s = OAuthBearerServer(v)
    asyncio.run(s.step(message))
    return s


def test_valid_token(signer: Signer) -> None:
    s = run(validator(signer), msg(signer.token("alice", ttl=120), "alice"))
    assert s.done and s.user == "alice" and 0 < s.lifetime_ms <= 120_000


def _unsigned(signer: Signer) -> str:
    head = base64.urlsafe_b64encode(json.dumps({"alg": "none"}).encode()).rstrip(b"=")
    body = base64.urlsafe_b64encode(
        json.dumps({"sub": "x", "iss": ISSUER, "aud": AUDIENCE, "exp": 2**40}).encode()
    ).rstrip(b"=")
    return f"{head.decode()}.{body.decode()}."


def _hmac_with_public_key(signer: Signer) -> str:
    pem = signer.key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    payload = {"sub": "x", "iss": ISSUER, "aud": AUDIENCE, "exp": 2**40}
    import hmac as hm

    head = base64.urlsafe_b64encode(b'{"alg":"HS256","kid":"k1"}').rstrip(b"=")
    body = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=")
    sig = hm.new(pem, head + b"." + body, "sha256").digest()
    return (head + b"." + body + b"." + base64.urlsafe_b64encode(sig).rstrip(b"=")).decode()


@pytest.mark.parametrize(
    "make",
    [
        lambda s: s.token("a", key=rsa.generate_private_key(public_exponent=65537, key_size=2048)),
        lambda s: s.token("a", ttl=-60),
        lambda s: s.token("a", iss="https://evil.test"),
        lambda s: s.token("a", aud="someone-else"),
        lambda s: jwt.encode({"sub": "a", "iss": ISSUER, "aud": AUDIENCE}, s.key, "RS256",
                             headers={"kid": "k1"}),  # no exp
        lambda s: jwt.encode({"sub": "a", "iss": ISSUER, "aud": AUDIENCE, "exp": 2**40}, s.key,
                             "RS256", headers={"kid": "other"}),
        lambda s: s.token("a")[:-5] + "AAAAA",
        _unsigned,
        _hmac_with_public_key,
        lambda s: "not.a.jwt",
    ],
)  # fmt: skip
def test_bad_tokens_fail(signer: Signer, make: Callable[[Signer], str]) -> None:
    with pytest.raises(SaslFailure):
        run(validator(signer), msg(make(signer)))


@pytest.mark.parametrize(
    "message",
    [b"", b"n,,", b"n,,\x01auth=Bearer\x01\x01", b"y,,\x01auth=Bearer x\x01\x01",
     b"n,,\x01auth=Basic x\x01\x01", b"n,,\x01auth=Bearer x\x01", b"\xff\xfe"],
)  # fmt: skip
def test_malformed_messages(signer: Signer, message: bytes) -> None:
    with pytest.raises(SaslFailure):
        run(validator(signer), message)


def test_authzid_must_match(signer: Signer) -> None:
    with pytest.raises(SaslFailure):
        run(validator(signer), msg(signer.token("alice"), "mallory"))


def test_jwks_file_rotation(tmp_path: Path) -> None:
    first = make_signer(tmp_path)
    v = validator(first)
    assert run(v, msg(first.token("a"))).done
    second = make_signer(tmp_path)  # a new key replaces the file
    assert run(v, msg(second.token("a"))).done
    with pytest.raises(SaslFailure):
        run(v, msg(first.token("a")))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_fuzz_never_authenticates(signer: Signer, data: bytes) -> None:
    try:
        run(validator(signer), data)
    except SaslFailure:
        return
    raise AssertionError("random bytes authenticated")


def test_jwks_from_url_refetched_for_an_unknown_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A JWKS URL (an in-process HTTP server): keys are fetched at start and fetched again
    when a token names a key id not seen yet (rotation at the identity provider)."""
    import http.server
    import threading

    first = make_signer(tmp_path / "a")
    served: dict[str, Any] = {"doc": first.jwks.read_bytes(), "hits": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            served["hits"] += 1
            body = served["doc"]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    from broker.security import oauth

    monkeypatch.setattr(oauth, "UNKNOWN_KID_REFETCH_S", 0.0)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
        v = JwtValidator(url, ISSUER, AUDIENCE)
        assert run(v, msg(first.token("a"))).user == "a"
        second = make_signer(tmp_path / "b")
        second.kid = "k2"
        doc = json.loads(second.jwks.read_text())
        doc["keys"][0]["kid"] = "k2"
        served["doc"] = json.dumps(doc).encode()
        assert run(v, msg(second.token("b"))).user == "b"
        assert served["hits"] == 2
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
