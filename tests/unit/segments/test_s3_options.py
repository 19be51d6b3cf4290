"""S3Store options from its URL (no connection is made here)."""

from __future__ import annotations

import pytest

from segments.s3_store import S3Store
from segments.store import StoreError
from tests.fixtures.s3 import free_ports

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


def test_direct_gets_by_default_unless_off_or_behind_a_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    assert S3Store.from_url(BASE)._direct is not None  # noqa: SLF001
    assert S3Store.from_url(BASE + "&direct_gets=false")._direct is None  # noqa: SLF001
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    assert S3Store.from_url(BASE)._direct is None  # noqa: SLF001


async def test_direct_get_of_an_unreachable_endpoint_is_a_store_error() -> None:
    (port,) = free_ports(1)  # nothing listens here: the direct GET fails, the SDK's too
    s = S3Store.from_url(BASE + f"&endpoint=http://127.0.0.1:{port}")
    assert s._direct is not None  # noqa: SLF001
    try:
        with pytest.raises(StoreError):
            await s.get_buffer("k", 0, 10)
    finally:
        await s.close()


def test_direct_puts_by_default_unless_off_virtual_hosted_or_behind_a_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    assert S3Store.from_url(BASE)._puts is not None  # noqa: SLF001
    assert S3Store.from_url(BASE + "&direct_puts=false")._puts is None  # noqa: SLF001
    assert S3Store.from_url(BASE + "&path_style=false")._puts is None  # noqa: SLF001
    monkeypatch.setenv("HTTP_PROXY", "http://proxy:3128")
    assert S3Store.from_url(BASE)._puts is None  # noqa: SLF001


async def test_direct_put_to_an_unreachable_endpoint_is_a_store_error() -> None:
    (port,) = free_ports(1)  # nothing listens here: the direct PUT fails, the SDK's too
    s = S3Store.from_url(BASE + f"&endpoint=http://127.0.0.1:{port}")
    assert s._puts is not None  # noqa: SLF001
    try:
        with pytest.raises(StoreError):
            await s.put_if_absent("k", [b"data"])
        assert s._puts is not None  # noqa: SLF001 - a connection failure does not turn it off
    finally:
        await s.close()


def test_checksum_header_is_the_crc32c_of_the_concatenation() -> None:
    import base64

    import crc32c

    from segments.s3_direct_put import checksum_header
    from segments.store import Buffer

    whole = crc32c.crc32c(b"hello world!")
    parts: list[Buffer] = [b"hello ", memoryview(b"world"), bytearray(b"!")]
    assert base64.b64decode(checksum_header(parts)) == whole.to_bytes(4, "big")
