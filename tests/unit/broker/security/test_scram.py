"""SCRAM and PLAIN server mechanisms: RFC 7677's test vector, a client of our own making
(kafka-python's SCRAM client), and every malformed or wrong message failing cleanly."""

from __future__ import annotations

import asyncio
import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.security import scram
from broker.security.config import Listener
from broker.security.sasl import PlainServer, ScramMechanism, Session, verify_plain
from broker.security.scram import SaslFailure, ScramCredential, ScramServer, make_credential

RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
RFC_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


class Creds:
    def __init__(self, table: dict[tuple[str, str], ScramCredential]) -> None:
        self.table = table

    async def scram(self, user: str, mechanism: str) -> ScramCredential | None:
        return self.table.get((user, mechanism))


def rfc_server(monkeypatch: pytest.MonkeyPatch) -> ScramServer:
    monkeypatch.setattr(scram.secrets, "token_urlsafe", lambda n: RFC_SERVER_NONCE)
    cred = make_credential("SCRAM-SHA-256", "pencil", 4096, RFC_SALT)
    s = ScramServer("SCRAM-SHA-256")
    assert s.parse_first(RFC_CLIENT_FIRST) == "user"
    assert s.server_first(cred) == RFC_SERVER_FIRST
    return s


def test_rfc7677_vector(monkeypatch: pytest.MonkeyPatch) -> None:
    s = rfc_server(monkeypatch)
    assert s.final(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL


@pytest.mark.parametrize(
    "final",
    [
        RFC_CLIENT_FINAL.replace(b"p=dHzb", b"p=dHzc"),  # wrong proof
        RFC_CLIENT_FINAL.replace(b"r=rOprNGfwEbeRWgbNEkqO%", b"r=rOprNGfwEbeRWgbNEkqX%"),  # nonce
        RFC_CLIENT_FINAL.replace(b"c=biws", b"c=eSws"),  # channel binding y,,
        RFC_CLIENT_FINAL[:-10],  # truncated proof
        b"c=biws,r=x",  # no proof
        b"\xff\xfe",
        b"",
    ],
)
def test_rfc_vector_tampered_fails(monkeypatch: pytest.MonkeyPatch, final: bytes) -> None:
    s = rfc_server(monkeypatch)
    with pytest.raises(SaslFailure):
        s.final(final)


@pytest.mark.parametrize(
    "first",
    [b"", b"n", b"n,,", b"p=tls-unique,,n=u,r=abc", b"n,,r=abc,n=u", b"n,,n=,r=abc",
     b"n,,n=u", b"n,,n=a=b,r=abc", b"n,,n=u,r=a,tokenauth=true", b"x,,n=u,r=abc",
     b"n,a=other,n=u,r=abc", b"\x80\x81", b"n,,n=u,r=" + b"a" * 9000],
)  # fmt: skip
def test_malformed_client_first(first: bytes) -> None:
    with pytest.raises(SaslFailure):
        ScramServer("SCRAM-SHA-512").parse_first(first)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kafka_python_client_against_server(mechanism: str) -> None:
    from kafka.net.sasl.scram import SaslMechanismScram

    cred = make_credential(mechanism, "s3cret")
    mech = ScramMechanism(Creds({("alice", mechanism): cred}), mechanism)
    client = SaslMechanismScram(
        sasl_mechanism=mechanism, sasl_plain_username="alice", sasl_plain_password="s3cret"
    )

    async def run() -> None:
        while not client.is_done():
            token = client.auth_bytes()
            reply = await mech.step(token)
            client.receive(reply)
        assert mech.done and client.is_authenticated()

    asyncio.run(run())


def test_unknown_user_fails_only_at_the_proof() -> None:
    from kafka.net.sasl.scram import SaslMechanismScram

    mech = ScramMechanism(Creds({}), "SCRAM-SHA-256")
    client = SaslMechanismScram(
        sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="ghost", sasl_plain_password="x"
    )

    async def run() -> None:
        client.receive(await mech.step(client.auth_bytes()))  # server-first as for anyone
        with pytest.raises(SaslFailure):
            await mech.step(client.auth_bytes())

    asyncio.run(run())


def test_plain() -> None:
    cred = make_credential("SCRAM-SHA-256", "pw")
    creds = Creds({("bob", "SCRAM-SHA-256"): cred})

    async def attempt(token: bytes) -> bool:
        try:
            await PlainServer(creds).step(token)
            return True
        except SaslFailure:
            return False

    assert asyncio.run(attempt(b"\x00bob\x00pw"))
    assert asyncio.run(attempt(b"bob\x00bob\x00pw"))
    for bad in (b"\x00bob\x00nope", b"eve\x00bob\x00pw", b"\x00bob", b"\x00\x00pw",
                b"\x00nobody\x00pw", b"\x00bob\x00pw\x00x", b"\x00\xff\x00pw"):  # fmt: skip
        assert not asyncio.run(attempt(bad)), bad


@pytest.mark.parametrize("user", ["bob", "nobody"])
def test_plain_failure_costs_one_pbkdf2_known_user_or_not(
    monkeypatch: pytest.MonkeyPatch, user: str
) -> None:
    """A wrong password and an unknown user both cost one PBKDF2 of the default
    iterations: the failure's timing does not tell whether the user exists."""
    creds = Creds({("bob", "SCRAM-SHA-256"): make_credential("SCRAM-SHA-256", "pw")})
    runs: list[int] = []
    real = scram.salted_password

    def counting(mechanism: str, password: bytes, salt: bytes, iterations: int) -> bytes:
        runs.append(iterations)
        return real(mechanism, password, salt, iterations)

    monkeypatch.setattr(scram, "salted_password", counting)
    assert asyncio.run(verify_plain(creds, user, b"wrong")) is None
    assert runs == [scram.DEFAULT_ITERATIONS]
    with pytest.raises(SaslFailure):
        asyncio.run(PlainServer(creds).step(b"\x00" + user.encode() + b"\x00wrong"))
    assert runs == [scram.DEFAULT_ITERATIONS] * 2


def test_session_gate_and_reauth_keeps_principal() -> None:
    listener = Listener("SASL_SSL", "SASL_SSL", "127.0.0.1", 1, "127.0.0.1", 1)
    s = Session(listener, mechanisms=("PLAIN",), max_reauth_ms=1000)
    assert s.permits(18) and s.permits(17) and s.permits(36)
    assert not s.permits(0) and not s.permits(3)
    assert not s.handshake("SCRAM-SHA-256") and s.handshake("PLAIN")
    assert s.succeeded("alice", 0) == 1000
    assert s.permits(0)
    assert not s.permits(0, now=s.expires_at + 1)  # type: ignore[operator]
    with pytest.raises(SaslFailure):
        s.succeeded("mallory", 0)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=300))
def test_fuzz_scram_messages_fail_cleanly(first: bytes, final: bytes) -> None:
    s = ScramServer("SCRAM-SHA-256")
    try:
        s.parse_first(first)
        s.server_first(None)
        s.final(final)
    except SaslFailure:
        return
    raise AssertionError("an unknown user must never authenticate")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_plain_fails_cleanly(token: bytes) -> None:
    creds = Creds({("bob", "SCRAM-SHA-256"): make_credential("SCRAM-SHA-256", "pw")})

    async def run() -> None:
        try:
            await PlainServer(creds).step(token)
        except SaslFailure:
            return
        assert token in (b"\x00bob\x00pw", b"bob\x00bob\x00pw")

    asyncio.run(run())


def test_librdkafka_legacy_nonce_is_accepted_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """librdkafka < 2.6.1 repeats the client nonce in client-final (librdkafka#4895):
    accepted in exactly that form, with a proof computed over it."""
    import hashlib
    import hmac as hm

    cnonce = "rOprNGfwEbeRWgbNEkqO"
    full = cnonce + RFC_SERVER_NONCE
    salted = scram.salted_password("SCRAM-SHA-256", b"pencil", RFC_SALT, 4096)
    client_key = hm.new(salted, b"Client Key", "sha256").digest()
    stored = hashlib.sha256(client_key).digest()

    def final_for(nonce: str) -> bytes:
        without = f"c=biws,r={nonce}"
        auth = f"n=user,r={cnonce},{RFC_SERVER_FIRST.decode()},{without}".encode()
        sig = hm.new(stored, auth, "sha256").digest()
        proof = bytes(a ^ b for a, b in zip(client_key, sig, strict=True))
        return f"{without},p={base64.b64encode(proof).decode()}".encode()

    assert rfc_server(monkeypatch).final(final_for(cnonce + full)).startswith(b"v=")
    for bad in (cnonce + cnonce + full, "x" + full, full[:-1], RFC_SERVER_NONCE):
        with pytest.raises(SaslFailure):
            rfc_server(monkeypatch).final(final_for(bad))
