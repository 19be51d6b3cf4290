"""S3Store options from its URL (no connection is made here)."""

from __future__ import annotations

from segments.s3_store import S3Store

BASE = "s3://b/p?region=us-east-1&access_key=k&secret_key=s"


def test_parallel_gets_is_opt_in() -> None:
    assert S3Store.from_url(BASE + "&endpoint=http://h:1").parallel_ranged_gets is False
    assert S3Store.from_url(BASE + "&parallel_gets=true").parallel_ranged_gets is True


def test_payload_signing_only_without_tls() -> None:
    http = S3Store.from_url(BASE + "&endpoint=http://127.0.0.1:8333")
    https = S3Store.from_url(BASE + "&endpoint=https://s3.example")
    aws = S3Store.from_url(BASE)  # no endpoint: AWS over https
    assert http._config.s3["payload_signing_enabled"] is True  # noqa: SLF001
    assert https._config.s3["payload_signing_enabled"] is False  # noqa: SLF001
    assert aws._config.s3["payload_signing_enabled"] is False  # noqa: SLF001
