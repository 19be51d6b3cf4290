"""``kafscale users`` and ``kafscale acls`` against a stopped cluster's embedded metadata
store (``--meta embedded --data-dir``), then a broker started on it enforces them."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from tests.fixtures.broker import free_port, start_broker
from tests.integration.kafka_raw import RawConn
from tests.integration.security.conftest import kafscale
from tests.integration.security.raw_sasl import login

pytestmark = pytest.mark.integration


def test_users_and_acls_on_a_stopped_store(tmp_path: Path) -> None:
    data = str(tmp_path / "b" / "data")
    meta = ["--meta", "embedded", "--data-dir", data]
    for user in ("carol", "dan"):
        r = kafscale("users", *meta, "create", user, "--password", f"{user}-pw",
                     "--mechanism", "SCRAM-SHA-512", "--iterations", "8192")  # fmt: skip
        assert r.returncode == 0, r.stderr
    r = kafscale("users", *meta, "delete", "dan")
    assert r.returncode == 0, r.stderr
    r = kafscale("users", *meta, "list")
    assert r.stdout.splitlines() == ["carol SCRAM-SHA-512:8192"]
    r = kafscale("users", *meta, "delete", "nobody")
    assert r.returncode == 1 and "no such user" in r.stderr
    for name in ("seen", "gone"):
        r = kafscale("acls", *meta, "add", "--allow-principal", "User:carol",
                     "--operation", "Describe", "--topic", name)  # fmt: skip
        assert r.returncode == 0, r.stderr
    r = kafscale("acls", *meta, "remove", "--topic", "gone")
    assert r.returncode == 0 and "removed TOPIC LITERAL gone User:carol" in r.stdout, r.stdout
    r = kafscale("acls", *meta, "list")
    assert r.stdout.splitlines() == ["TOPIC LITERAL seen User:carol * DESCRIBE ALLOW"]
    r = kafscale("acls", *meta, "add", "--topic", "x")  # no principal: a usage error
    assert r.returncode == 2

    sasl = free_port()
    b = start_broker(tmp_path / "b", extra_args=(
        "--listener", f"SASL_PLAINTEXT://127.0.0.1:{sasl}", "--authorizer", "true",
        "--default-partitions", "1"))  # fmt: skip
    try:
        with RawConn(sasl) as c:
            login(c, "carol", "carol-pw", "SCRAM-SHA-512")
            req = MetadataRequest(topics=[("seen",), ("gone",)], allow_auto_topic_creation=False)
            codes = {t.name: t.error_code for t in c.call(req, MetadataResponse, 9, 5).topics}
        assert codes == {"seen": 3, "gone": 29}  # UNKNOWN_TOPIC_OR_PARTITION vs denied
    finally:
        b.stop()
