"""Client quotas (issue 12): Kafka's rate and throttle arithmetic, the resolution order of
quota entities, and the admin APIs' validation and filters, on the embedded store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.meta.base import open_meta
from broker.quotas import FETCH, PRODUCE, SAMPLES, WINDOW_MS, QuotaError, QuotaStore, Rate
from protocol.errors import ErrorCode


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_rate_counts_at_least_the_full_window() -> None:
    r = Rate()
    r.record(10_000, 0.0)
    # one sample: the window is still SAMPLES - 1 full windows (Kafka's Rate)
    assert r.window_ms(0.0) == (SAMPLES - 1) * WINDOW_MS
    assert r.per_second(0.0) == pytest.approx(1000.0)
    # samples older than SAMPLES windows are dropped
    assert r.per_second(SAMPLES * WINDOW_MS + 1) == 0.0


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[tuple[QuotaStore, Clock]]:
    meta = open_meta("embedded", data_dir=str(tmp_path))
    clock = Clock()
    qs = QuotaStore(meta, clock=clock)
    await qs.start()
    try:
        yield qs, clock
    finally:
        await qs.stop()
        await meta.close()


USER, CLIENT = ("user",), ("client-id",)


async def test_throttle_is_kafkas_delay(store: tuple[QuotaStore, Clock]) -> None:
    qs, clock = store
    assert await qs.alter((("client-id", "slow"),), [(PRODUCE, 1000.0, False)], False) is None
    assert qs.record(PRODUCE, "ANONYMOUS", "other", 10**9) == 0  # no quota for it
    # 5000 bytes over the minimum 10 s window: 500 B/s, under the bound
    assert qs.record(PRODUCE, "ANONYMOUS", "slow", 5000) == 0
    # 25000 bytes: 2500 B/s; delay = (2500 - 1000) / 1000 * 10 s = 15 s
    assert qs.record(PRODUCE, "ANONYMOUS", "slow", 20000) == 15000
    assert qs.current_throttle(PRODUCE, "ANONYMOUS", "slow") == 15000
    clock.t += 20  # the samples age out
    assert qs.current_throttle(PRODUCE, "ANONYMOUS", "slow") == 0
    assert qs.record(FETCH, "ANONYMOUS", "slow", 10**9) == 0  # fetch quota unset


async def test_resolution_order_and_shared_rates(store: tuple[QuotaStore, Clock]) -> None:
    qs, _clock = store
    await qs.alter((("client-id", None),), [(PRODUCE, 100.0, False)], False)
    await qs.alter((("user", "alice"),), [(PRODUCE, 200.0, False)], False)
    await qs.alter((("client-id", "c"), ("user", "alice")), [(PRODUCE, 300.0, False)], False)
    assert qs.bound(PRODUCE, "alice", "c") == (300.0, (PRODUCE, "alice", "c"))
    # user-level quota: every client of alice shares one rate
    assert qs.bound(PRODUCE, "alice", "x") == (200.0, (PRODUCE, "alice", ""))
    # default client-id quota: each client id has its own rate at that bound
    assert qs.bound(PRODUCE, "bob", "y") == (100.0, (PRODUCE, "", "y"))
    await qs.alter((("client-id", None),), [(PRODUCE, 0.0, True)], False)
    assert qs.bound(PRODUCE, "bob", "y")[0] == 0.0
    assert (("client-id", None),) not in qs.records  # no quota left: the key is gone


async def test_alter_validation_and_describe_filters(store: tuple[QuotaStore, Clock]) -> None:
    qs, _clock = store
    refused = [
        ((("ip", "1.2.3.4"),), [(PRODUCE, 10.0, False)], "not enforced"),
        ((("user", "u"),), [("request_percentage", 10.0, False)], "not enforced"),
        ((("user", "u"),), [(PRODUCE, -1.0, False)], "positive"),
        ((("user", "u"),), [(PRODUCE, 1.5, False)], "whole"),
        ((("user", "u"),), [(PRODUCE, float("nan"), False)], "whole"),
        ((("user", "u"),), [(PRODUCE, float("inf"), False)], "whole"),
        ((), [(PRODUCE, 1.0, False)], "once"),
        ((("user", "u"), ("user", "v")), [(PRODUCE, 1.0, False)], "once"),
    ]
    for entity, ops, why in refused:
        err = await qs.alter(entity, ops, False)
        assert isinstance(err, QuotaError) and err.code == ErrorCode.INVALID_REQUEST, entity
        assert why in err.message
    assert await qs.alter((("user", "u"),), [(PRODUCE, 5.0, False)], True) is None
    assert qs.records == {}  # validate only
    await qs.alter((("user", "u"),), [(PRODUCE, 5.0, False), (FETCH, 7.0, False)], False)
    await qs.alter((("client-id", "c"), ("user", "u")), [(FETCH, 9.0, False)], False)
    await qs.alter((("user", None),), [(FETCH, 11.0, False)], False)

    def names(found: object) -> list[object]:
        assert isinstance(found, list)
        return [r.entity for r in found]

    assert names(qs.describe([("user", 0, "u")], strict=True)) == [(("user", "u"),)]
    assert len(names(qs.describe([("user", 0, "u")], strict=False))) == 2
    assert names(qs.describe([("user", 1, None)], strict=False)) == [(("user", None),)]
    assert len(names(qs.describe([("user", 2, None)], strict=False))) == 2
    assert len(names(qs.describe([], strict=False))) == 3
    bad = qs.describe([("user", 0, "u"), ("user", 1, None)], strict=False)
    assert isinstance(bad, QuotaError)
    (rec,) = qs.describe([("user", 0, "u")], strict=True)  # type: ignore[misc]
    assert dict(rec.quotas) == {PRODUCE: 5.0, FETCH: 7.0}
