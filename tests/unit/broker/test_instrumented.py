"""broker.instrumented: the store wrappers time every call, count failures and bytes, and
classify failed transactions, over the real local store and embedded metadata store."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker.instrumented import InstrumentedMeta, InstrumentedStore
from broker.meta.base import Compare, Put, open_meta
from broker.telemetry import Telemetry
from segments.store import ObjectExistsError, open_store


def _samples(t: Telemetry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(t)
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_store_calls_bytes_and_errors(tmp_path: Path) -> None:
    t = Telemetry()
    store = InstrumentedStore(open_store(f"file://{tmp_path}/objects"), t)
    try:
        await store.put_if_absent("a/b", [b"12345", b"678"])
        assert await store.get("a/b") == b"12345678"
        with pytest.raises(ObjectExistsError):
            await store.put_if_absent("a/b", [b"x"])
        assert [o.key for o in await store.list("a/")] == ["a/b"]
    finally:
        await store.close()
    m = _samples(t)
    assert m[("kafscale_store_request_duration_seconds_count", (("op", "put"),))] == 2
    assert m[("kafscale_store_errors_total", (("op", "put"),))] == 1
    assert m[("kafscale_store_errors_total", (("op", "get"),))] == 0
    assert m[("kafscale_store_bytes_total", (("op", "put"),))] == 8
    assert m[("kafscale_store_bytes_total", (("op", "get"),))] == 8
    assert m[("kafscale_store_request_duration_seconds_count", (("op", "list"),))] == 1


async def test_meta_conflicts_by_cause(tmp_path: Path) -> None:
    t = Telemetry()
    meta = InstrumentedMeta(open_meta("embedded", data_dir=str(tmp_path)), t)
    try:
        assert meta.max_txn_ops > 0
        rev = await meta.put("/owners/t/0", b"me")
        await meta.put("/logs/t/0/end", b"{}")
        owner = Compare("/owners/t/0", "value", "==", b"someone-else")
        assert not (await meta.txn([owner], [Put("/x", b"1")])).succeeded
        absent = Compare("/owners/t/0", "create_revision", "==", 0)
        assert not (await meta.txn([absent], [Put("/x", b"1")])).succeeded
        moved = Compare("/logs/t/0/end", "mod_revision", "==", rev - 100)
        assert not (await meta.txn([moved], [Put("/x", b"1")])).succeeded
        assert (await meta.txn([Compare("/owners/t/0", "value", "==", b"me")], [])).succeeded
    finally:
        await meta.close()
    m = _samples(t)
    for cause in ("fenced", "exists", "revision"):
        assert m[("kafscale_meta_txn_conflicts_total", (("cause", cause),))] == 1, cause
    assert m[("kafscale_meta_request_duration_seconds_count", (("op", "txn"),))] == 4
    assert m[("kafscale_meta_request_duration_seconds_count", (("op", "put"),))] == 2


async def test_paced_puts_are_timed_and_counted_as_puts(tmp_path: Path) -> None:
    """``put_background`` through the wrapper: the local store's paced PUT, counted as
    a put (broker/merging.py writes merged segments this way)."""
    from segments.store import paces_puts, put_background

    t = Telemetry()
    store = InstrumentedStore(open_store(f"file://{tmp_path}/objects"), t)
    try:
        assert paces_puts(store)
        await put_background(store, "m/1", [b"x" * 300_000])
        assert await store.get("m/1") == b"x" * 300_000
        with pytest.raises(ObjectExistsError):
            await put_background(store, "m/1", [b"y"])
    finally:
        await store.close()
    m = _samples(t)
    assert m[("kafscale_store_request_duration_seconds_count", (("op", "put"),))] == 2
    assert m[("kafscale_store_bytes_total", (("op", "put"),))] == 300_000
