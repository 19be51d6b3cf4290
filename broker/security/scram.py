"""SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, RFC 7677): credentials and the server side.

A credential is what Kafka stores: salt, iterations, StoredKey = H(HMAC(SaltedPassword,
"Client Key")) and ServerKey = HMAC(SaltedPassword, "Server Key"); never the password.
PLAIN logins are checked against the same credential (one PBKDF2 per login).

:class:`ScramServer` runs one exchange: client-first -> server-first, client-final ->
server-final. Any malformed message, wrong nonce or wrong proof raises
:class:`SaslFailure`; proofs are compared with ``hmac.compare_digest``. An unknown user
gets a made-up salt and fails at the proof, as a wrong password does (no user probing).
The client nonce sent twice by librdkafka before 2.6.1 is accepted (``_nonce_matches``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass

HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MECHANISM_IDS = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}  # Kafka's ScramMechanism
MECHANISM_NAMES = {v: k for k, v in MECHANISM_IDS.items()}
MIN_ITERATIONS, MAX_ITERATIONS = 4096, 16384  # Kafka's accepted range
DEFAULT_ITERATIONS = 4096
MAX_MESSAGE = 8192
#: made-up salts of unknown users: stable per user within this process (a repeated probe
#: sees the same salt, as for a real user), unpredictable from outside
_FAKE_SALT_KEY = os.urandom(32)


class SaslFailure(Exception):
    """Authentication failed; the message is safe to send and log (no secrets)."""


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def to_json(self) -> dict[str, object]:
        b64 = base64.b64encode
        return {
            "salt": b64(self.salt).decode(),
            "iterations": self.iterations,
            "stored_key": b64(self.stored_key).decode(),
            "server_key": b64(self.server_key).decode(),
        }

    @classmethod
    def from_json(cls, d: dict[str, object]) -> ScramCredential:
        b = base64.b64decode
        return cls(
            b(str(d["salt"])),
            int(str(d["iterations"])),
            b(str(d["stored_key"])),
            b(str(d["server_key"])),
        )


def _hmac(alg: str, key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, alg).digest()


def salted_password(mechanism: str, password: bytes, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(HASHES[mechanism], password, salt, iterations)


def from_salted(mechanism: str, salted: bytes, salt: bytes, iterations: int) -> ScramCredential:
    """The stored credential for a salted password (AlterUserScramCredentials sends that)."""
    alg = HASHES[mechanism]
    client_key = _hmac(alg, salted, b"Client Key")
    stored = hashlib.new(alg, client_key).digest()
    return ScramCredential(salt, iterations, stored, _hmac(alg, salted, b"Server Key"))


def make_credential(
    mechanism: str, password: str, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None
) -> ScramCredential:
    salt = salt if salt is not None else os.urandom(32)
    salted = salted_password(mechanism, password.encode(), salt, iterations)
    return from_salted(mechanism, salted, salt, iterations)


def unknown_user_credential(mechanism: str) -> ScramCredential:
    """A credential no password matches, with the default iterations: checking a password
    of an unknown user against it costs one PBKDF2, as a wrong password of a real user
    does, so the time of a failed PLAIN login does not tell whether the user exists."""
    cred = _UNKNOWN.get(mechanism)
    if cred is None:
        size = hashlib.new(HASHES[mechanism]).digest_size
        keys = os.urandom(size), os.urandom(size)
        cred = ScramCredential(os.urandom(32), DEFAULT_ITERATIONS, *keys)
        _UNKNOWN[mechanism] = cred
    return cred


_UNKNOWN: dict[str, ScramCredential] = {}


def check_password(mechanism: str, cred: ScramCredential, password: bytes) -> bool:
    """Whether ``password`` is the one ``cred`` was made from (PLAIN logins)."""
    alg = HASHES[mechanism]
    salted = salted_password(mechanism, password, cred.salt, cred.iterations)
    stored = hashlib.new(alg, _hmac(alg, salted, b"Client Key")).digest()
    return hmac.compare_digest(stored, cred.stored_key)


def _attrs(text: str) -> list[tuple[str, str]]:
    out = []
    for part in text.split(","):
        if len(part) < 2 or part[1] != "=" or not part[0].isalpha():
            raise SaslFailure("malformed SCRAM message")
        out.append((part[0], part[2:]))
    return out


def _saslname(text: str) -> str:
    """RFC 5802 saslname: ``=2C`` is ``,`` and ``=3D`` is ``=``; any other ``=`` is bad."""
    if any(text[i + 1 : i + 3] not in ("2C", "3D") for i, c in enumerate(text) if c == "="):
        raise SaslFailure("malformed SCRAM user name")
    return text.replace("=2C", ",").replace("=3D", "=")


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise SaslFailure("malformed SCRAM message") from None


class ScramServer:
    """One SCRAM exchange on the server side (two client messages)."""

    def __init__(self, mechanism: str) -> None:
        self.mechanism = mechanism
        self.alg = HASHES[mechanism]
        self.state = "first"
        self.user = ""
        self._gs2 = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._cred: ScramCredential | None = None
        self._fake = False
        self._client_nonce = ""

    def server_first(self, cred: ScramCredential | None) -> bytes:
        """Answer the parsed client-first with server-first; ``cred`` is the user's
        credential (None: unknown user, answered alike and failed at the proof)."""
        if self.state != "first" or not self.user:
            raise SaslFailure("unexpected SCRAM message")
        user = self.user
        if cred is None:
            self._fake = True
            salt = hmac.new(_FAKE_SALT_KEY, user.encode(), self.alg).digest()[:32]
            cred = ScramCredential(salt, DEFAULT_ITERATIONS, os.urandom(32), os.urandom(32))
        self._cred = cred
        self._nonce = self._client_nonce + secrets.token_urlsafe(24)
        salt64 = base64.b64encode(cred.salt).decode()
        self._server_first = f"r={self._nonce},s={salt64},i={cred.iterations}"
        self.state = "final"
        return self._server_first.encode()

    def parse_first(self, message: bytes) -> str:
        """Parse client-first; returns the user name to look the credential up for."""
        if self.state != "first":
            raise SaslFailure("unexpected SCRAM message")
        text = _text(message)
        gs2_flag, sep, rest = text.partition(",")
        authzid, sep2, bare = rest.partition(",")
        if not sep or not sep2 or gs2_flag not in ("n", "y"):
            raise SaslFailure("malformed SCRAM client-first message (channel binding unsupported)")
        if authzid and not authzid.startswith("a="):
            raise SaslFailure("malformed SCRAM client-first message")
        attrs = _attrs(bare)
        if len(attrs) < 2 or attrs[0][0] != "n" or attrs[1][0] != "r" or not attrs[1][1]:
            raise SaslFailure("malformed SCRAM client-first message")
        if attrs[0][1] == "" or any(k == "m" for k, _ in attrs):
            raise SaslFailure("malformed SCRAM client-first message")
        extensions = dict(attrs[2:])
        if "tokenauth" in extensions:
            raise SaslFailure("delegation tokens are not supported")
        self.user = _saslname(attrs[0][1])
        if authzid and _saslname(authzid[2:]) != self.user:
            raise SaslFailure("authorization id differs from the user name")
        self._client_nonce = attrs[1][1]
        if not all(0x21 <= ord(c) <= 0x7E and c != "," for c in self._client_nonce):
            raise SaslFailure("malformed SCRAM nonce")
        self._gs2 = f"{gs2_flag},{authzid},"
        self._client_first_bare = bare
        return self.user

    def _nonce_ok(self, sent: str) -> bool:
        return _nonce_matches(sent, self._nonce, self._client_nonce)

    def final(self, message: bytes) -> bytes:
        """Check client-final; returns server-final (raises SaslFailure on a bad proof)."""
        if self.state != "final" or self._cred is None:
            raise SaslFailure("unexpected SCRAM message")
        self.state = "done"
        text = _text(message)
        without_proof, sep, proof_attr = text.rpartition(",")
        attrs = _attrs(text)
        if not sep or len(attrs) < 3 or attrs[0][0] != "c" or attrs[1][0] != "r":
            raise SaslFailure("malformed SCRAM client-final message")
        if attrs[-1][0] != "p" or not proof_attr.startswith("p="):
            raise SaslFailure("malformed SCRAM client-final message")
        if _b64(attrs[0][1]) != self._gs2.encode():
            raise SaslFailure("SCRAM channel binding mismatch")
        if not self._nonce_ok(attrs[1][1]):
            raise SaslFailure("SCRAM nonce mismatch")
        proof = _b64(attrs[-1][1])
        auth = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        cred = self._cred
        signature = _hmac(self.alg, cred.stored_key, auth)
        if len(proof) != len(signature):
            raise SaslFailure("invalid credentials")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        ok = hmac.compare_digest(hashlib.new(self.alg, client_key).digest(), cred.stored_key)
        if not ok or self._fake:
            raise SaslFailure("invalid credentials")
        verifier = base64.b64encode(_hmac(self.alg, cred.server_key, auth)).decode()
        return f"v={verifier}".encode()


def _nonce_matches(sent: str, nonce: str, client_nonce: str) -> bool:
    """The client-final nonce must be the combined nonce of server-first. librdkafka
    before 2.6.1 sends the client nonce once more in front of it (librdkafka#4895);
    that exact form is accepted too, as Kafka 3.8.1-3.9 did: it still carries the whole
    server nonce, and the proof covers it, so a replay stays impossible."""
    ok = hmac.compare_digest(sent.encode(), nonce.encode())
    legacy = hmac.compare_digest(sent.encode(), (client_nonce + nonce).encode())
    return ok or legacy


def _text(message: bytes) -> str:
    if len(message) > MAX_MESSAGE:
        raise SaslFailure("SCRAM message too long")
    try:
        return message.decode("utf-8")
    except UnicodeDecodeError:
        raise SaslFailure("SCRAM message is not UTF-8") from None
