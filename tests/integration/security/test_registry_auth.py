"""The schema registry behind HTTP Basic auth (``--registry-auth basic``,
docs/registry.md "Authentication") on the session's secured broker: confluent-kafka's
SchemaRegistryClient with ``basic.auth.user.info`` registers and reads schemas with a
SCRAM user's password; a wrong password, an unknown user or no credentials get 401 with
the registry's error body; the other HTTP endpoints stay open."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
import uuid

import pytest

from tests.integration.security.conftest import PASSWORDS, SecureBroker

pytestmark = pytest.mark.integration
sr = pytest.importorskip(
    "confluent_kafka.schema_registry",
    reason="needs confluent-kafka's schema registry dependencies (fastavro, httpx, authlib)",
)
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient  # noqa: E402
from confluent_kafka.schema_registry.error import SchemaRegistryError  # noqa: E402

AVRO = json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]})


def url(sb: SecureBroker) -> str:
    return f"http://127.0.0.1:{sb.ports['HTTP']}/registry"


def client(sb: SecureBroker, userinfo: str | None) -> SchemaRegistryClient:
    conf = {"url": url(sb)}
    if userinfo is not None:
        conf["basic.auth.user.info"] = userinfo
    return SchemaRegistryClient(conf)


def raw_get(sb: SecureBroker, path: str, auth: str | None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{sb.ports['HTTP']}{path}")
    if auth is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_right_password_registers_and_reads(secure_broker: SecureBroker) -> None:
    subject = f"auth-{uuid.uuid4().hex[:8]}-value"
    with client(secure_broker, f"alice:{PASSWORDS['alice']}") as alice:
        sid = alice.register_schema(subject, Schema(AVRO, "AVRO"))
        assert json.loads(alice.get_schema(sid).schema_str) == json.loads(AVRO)
    # another user sees the same registry
    with client(secure_broker, f"bob:{PASSWORDS['bob']}") as bob:
        assert subject in bob.get_subjects()
        assert bob.get_latest_version(subject).schema_id == sid


@pytest.mark.parametrize("userinfo", ["alice:wrong-password", "nobody:x", None])
def test_bad_or_missing_credentials_get_401(
    secure_broker: SecureBroker, userinfo: str | None
) -> None:
    with client(secure_broker, userinfo) as c, pytest.raises(SchemaRegistryError) as err:
        c.get_subjects()
    assert err.value.http_status_code == 401 and err.value.error_code == 40101


def test_401_body_and_challenge_and_open_endpoints(secure_broker: SecureBroker) -> None:
    status, headers, body = raw_get(secure_broker, "/registry/subjects", "alice:nope")
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic ")
    assert json.loads(body)["error_code"] == 40101
    status, _, body = raw_get(secure_broker, "/registry/subjects", f"admin:{PASSWORDS['admin']}")
    assert status == 200 and isinstance(json.loads(body), list)
    assert raw_get(secure_broker, "/registry", None)[0] == 401
    assert raw_get(secure_broker, "/healthz", None)[0] == 200  # probes need no credentials
