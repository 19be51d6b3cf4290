"""Parsing of the registry's HTTP Basic credentials (broker/registry/auth.py); the checks
against stored users run in tests/integration/security/test_registry_auth.py."""

from __future__ import annotations

import base64

import pytest

from broker.registry.auth import parse_basic


def basic(raw: bytes) -> str:
    return "Basic " + base64.b64encode(raw).decode()


def test_user_and_password() -> None:
    assert parse_basic(basic(b"alice:s3cr:et")) == ("alice", b"s3cr:et")
    assert parse_basic("basic " + base64.b64encode(b"bob:pw").decode()) == ("bob", b"pw")


@pytest.mark.parametrize(
    "header",
    [None, "", "Bearer abc", "Basic", "Basic !!!notbase64", basic(b"nocolon"),
     basic(b":pw"), basic(b"alice:"), basic(b"\xff\xfe:pw")],
)  # fmt: skip
def test_malformed_is_none(header: str | None) -> None:
    assert parse_basic(header) is None
