"""One contract for every MetaStore. Here: the embedded store; the same tests run against a
real etcd process in tests/integration/broker/meta/test_contract_etcd.py."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path
from typing import cast

import pytest

from broker.meta.base import (
    Compare,
    Delete,
    Get,
    LeaseExpiredError,
    MetaStore,
    MetaStoreError,
    Put,
    WatchEvent,
)
from broker.meta.embedded import EmbeddedStore

EVENT_TIMEOUT = 10.0

# A second view of the same backend under another prefix (etcd: another client;
# embedded: a read-only reader of the same directory, which sees what is durable).
Opener = Callable[[str], MetaStore]


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[tuple[MetaStore, Opener]]:
    """The embedded store; tests/integration/broker/meta/test_contract_etcd.py runs this
    module's tests again against a real etcd."""
    prefix = f"/t{uuid.uuid4().hex}"
    path = str(tmp_path / "meta")
    store = EmbeddedStore(path, prefix=prefix)
    opened: list[MetaStore] = []

    def other(p: str) -> MetaStore:
        opened.append(EmbeddedStore(path, prefix=p, read_only=True))
        return opened[-1]

    try:
        yield store, other
    finally:
        for s in opened:
            await s.close()
        await store.close()


@pytest.fixture
def store(backend: tuple[MetaStore, Opener]) -> MetaStore:
    return backend[0]


def closing(
    it: AsyncIterator[WatchEvent],
) -> contextlib.aclosing[AsyncGenerator[WatchEvent, None]]:
    """Both stores return async generators; the Protocol only promises an iterator."""
    return contextlib.aclosing(cast(AsyncGenerator[WatchEvent, None], it))


async def next_event(it: AsyncIterator[WatchEvent]) -> WatchEvent:
    async with asyncio.timeout(EVENT_TIMEOUT):
        return await anext(it)


async def collect(it: AsyncIterator[WatchEvent], n: int) -> list[WatchEvent]:
    return [await next_event(it) for _ in range(n)]


# ------------------------------------------------------------------------ KV


async def test_put_get_delete_tracks_revisions_and_versions(store: MetaStore) -> None:
    assert await store.get("/k") is None
    r1 = await store.put("/k", b"one")
    kv = await store.get("/k")
    assert kv is not None
    assert (kv.key, kv.value, kv.version, kv.lease) == ("/k", b"one", 1, 0)
    assert kv.create_revision == kv.mod_revision == r1
    r2 = await store.put("/k", b"two")
    assert r2 > r1
    kv = await store.get("/k")
    assert kv is not None
    assert (kv.value, kv.version, kv.create_revision, kv.mod_revision) == (b"two", 2, r1, r2)
    assert await store.delete("/k") == 1
    assert await store.get("/k") is None
    assert await store.delete("/k") == 0
    r3 = await store.put("/k", b"three")
    kv = await store.get("/k")
    assert kv is not None and (kv.version, kv.create_revision) == (1, r3)


async def test_range_is_sorted_and_prefix_scoped(store: MetaStore) -> None:
    for key in ["/b", "/a/c", "/ab", "/a/b", "/a/b/x", "/a"]:
        await store.put(key, key.encode())
    assert [kv.key for kv in await store.range("/a/")] == ["/a/b", "/a/b/x", "/a/c"]
    assert [kv.key for kv in await store.range("")] == ["/a", "/a/b", "/a/b/x", "/a/c", "/ab", "/b"]
    assert [kv.value for kv in await store.range("/a/b")] == [b"/a/b", b"/a/b/x"]
    assert await store.range("/nothing/") == []
    assert await store.delete("/a/", prefix=True) == 3
    assert [kv.key for kv in await store.range("")] == ["/a", "/ab", "/b"]


async def test_keys_are_ranges_keys(store: MetaStore) -> None:
    """``keys`` lists what ``range`` would, sorted and prefix-scoped, values left out."""
    for key in ["/g/b/offsets/t/1", "/g/a/state", "/g/a/offsets/t/0", "/h/x", "/g"]:
        await store.put(key, b"v" * 100)
    assert await store.keys("/g/") == ["/g/a/offsets/t/0", "/g/a/state", "/g/b/offsets/t/1"]
    assert await store.keys("/g/") == [kv.key for kv in await store.range("/g/")]
    assert await store.keys("") == [kv.key for kv in await store.range("")]
    assert await store.keys("/nothing/") == []
    await store.delete("/g/a/state")
    assert await store.keys("/g/a/") == ["/g/a/offsets/t/0"]


#: past gRPC's default 4 MiB limit on a received message (the etcd client's answers)
LARGE_BYTES = 6 * 1024 * 1024


async def test_ranges_and_keys_larger_than_a_grpc_message(store: MetaStore) -> None:
    """A partition's segment entries, every committed offset's key (the group listing) or
    every topic can add up to more than 4 MiB: ``range`` and ``keys`` return all of it,
    sorted, each value whole."""
    key_pad, value_bytes = "k" * 900, 8 * 1024  # one txn stays under etcd's 1.5 MiB request
    n = LARGE_BYTES // (len(key_pad) + value_bytes) + 1
    per_txn = 100
    for first in range(0, n, per_txn):
        puts = [
            Put(f"/big/{i:06d}/{key_pad}", i.to_bytes(4, "big") * (value_bytes // 4))
            for i in range(first, min(n, first + per_txn))
        ]
        assert (await store.txn([], puts)).succeeded
    await store.put("/bigger", b"outside")
    kvs = await store.range("/big/")
    assert [kv.key for kv in kvs] == [f"/big/{i:06d}/{key_pad}" for i in range(n)]
    assert all(kv.value == i.to_bytes(4, "big") * (value_bytes // 4) for i, kv in enumerate(kvs))
    assert sum(len(kv.key) + len(kv.value) for kv in kvs) > LARGE_BYTES
    assert await store.keys("/big/") == [kv.key for kv in kvs]
    many = [f"/many/{i:06d}/{'x' * 1000}" for i in range(LARGE_BYTES // 1000 + 1)]
    for first in range(0, len(many), store.max_txn_ops):
        await store.txn([], [Put(k, b"") for k in many[first : first + store.max_txn_ops]])
    assert await store.keys("/many/") == many  # keys alone past the limit


async def test_prefixes_isolate_stores(backend: tuple[MetaStore, Opener]) -> None:
    store, other = backend
    await store.put("/shared", b"mine")
    stranger = other(f"/t{uuid.uuid4().hex}")
    assert await stranger.get("/shared") is None
    assert await stranger.range("") == []
    assert await stranger.keys("") == []
    assert await store.keys("") == ["/shared"]


async def test_revisions_increase_and_a_txn_is_one_revision(store: MetaStore) -> None:
    revs = [await store.put(f"/r{i}", b"x") for i in range(5)]
    assert revs == sorted(revs) and len(set(revs)) == 5
    res = await store.txn([], [Put("/t1", b"a"), Put("/t2", b"b"), Delete("/r0")])
    assert res.succeeded and res.revision == revs[-1] + 1
    kvs = await store.range("/t")
    assert [kv.mod_revision for kv in kvs] == [res.revision, res.revision]
    assert await store.put("/after", b"x") == res.revision + 1


async def test_concurrent_txns_on_disjoint_keys_each_take_a_revision(store: MetaStore) -> None:
    """Transactions sent together (a flush cycle's commit chunks): each is applied once,
    as its own revision, and each sees its own guard."""
    await store.put("/g/guard", b"0")
    results = await asyncio.gather(
        *(
            store.txn(
                [Compare("/g/guard", "value", "==", b"0")] if i % 2 else [],
                [Put(f"/g/k{i}/a", b"%d" % i), Put(f"/g/k{i}/b", b"%d" % i)],
            )
            for i in range(12)
        )
    )
    assert all(r.succeeded for r in results)
    revs = sorted(r.revision for r in results)
    assert len(set(revs)) == 12 and revs[-1] - revs[0] == 11
    kvs = await store.range("/g/k")
    assert len(kvs) == 24
    by_rev = {r.revision for r in results}
    assert {kv.mod_revision for kv in kvs} == by_rev


async def test_concurrent_compare_and_set_on_one_key_has_one_winner(store: MetaStore) -> None:
    """(The first write keeps the embedded store busy, so that the ten queue together.)"""
    busy = asyncio.ensure_future(store.put("/busy", b"x"))
    results = await asyncio.gather(
        *(
            store.txn(
                [Compare("/cas", "version", "==", 0)], [Put("/cas", b"%d" % i)], [Get("/cas")]
            )
            for i in range(10)
        )
    )
    await busy
    winners = [i for i, r in enumerate(results) if r.succeeded]
    assert len(winners) == 1
    kv = await store.get("/cas")
    assert kv is not None and kv.value == b"%d" % winners[0]
    for r in results:
        if not r.succeeded:
            assert r.gets[0][0].value == kv.value


# ----------------------------------------------------------------------- txn


async def _compare_cases(store: MetaStore) -> list[tuple[Compare, bool]]:
    await store.put("/k", b"v1")
    await store.put("/k", b"v2")
    kv = await store.get("/k")
    assert kv is not None
    c, m = kv.create_revision, kv.mod_revision
    return [
        (Compare("/k", "value", "==", b"v2"), True),
        (Compare("/k", "value", "==", b"v1"), False),
        (Compare("/k", "value", "!=", b"v1"), True),
        (Compare("/k", "value", "<", b"v3"), True),
        (Compare("/k", "value", ">", b"v3"), False),
        (Compare("/k", "version", "==", 2), True),
        (Compare("/k", "version", ">", 2), False),
        (Compare("/k", "version", "<", 3), True),
        (Compare("/k", "create_revision", "==", c), True),
        (Compare("/k", "create_revision", "!=", c), False),
        (Compare("/k", "mod_revision", "==", m), True),
        (Compare("/k", "mod_revision", "<", m), False),
        (Compare("/k", "mod_revision", ">", c), True),
        (Compare("/missing", "version", "==", 0), True),
        (Compare("/missing", "version", ">", 0), False),
        (Compare("/missing", "create_revision", "==", 0), True),
        (Compare("/missing", "mod_revision", "==", 0), True),
        (Compare("/missing", "mod_revision", "<", m), True),
        (Compare("/missing", "value", "==", b""), False),
        (Compare("/missing", "value", "!=", b"x"), False),
    ]


async def test_txn_compares_on_present_and_missing_keys(store: MetaStore) -> None:
    for compare, expected in await _compare_cases(store):
        res = await store.txn([compare], [Get("/k")], [])
        assert res.succeeded is expected, compare
        assert len(res.gets) == (1 if expected else 0)


async def test_txn_runs_success_or_failure_branch(store: MetaStore) -> None:
    await store.put("/owner", b"epoch-1")
    ok = await store.txn(
        [Compare("/owner", "value", "==", b"epoch-1")],
        [Put("/owner", b"epoch-2"), Put("/log", b"a")],
        [Put("/fenced", b"yes")],
    )
    assert ok.succeeded
    bad = await store.txn(
        [Compare("/owner", "value", "==", b"epoch-1")],
        [Put("/log", b"zombie")],
        [Put("/fenced", b"yes"), Get("/owner")],
    )
    assert not bad.succeeded
    assert bad.revision == ok.revision + 1
    assert [kv.value for kv in bad.gets[0]] == [b"epoch-2"]
    log_kv = await store.get("/log")
    assert log_kv is not None and log_kv.value == b"a"
    fenced = await store.get("/fenced")
    assert fenced is not None and fenced.value == b"yes"


async def test_txn_all_compares_must_hold(store: MetaStore) -> None:
    await store.put("/a", b"1")
    res = await store.txn(
        [Compare("/a", "value", "==", b"1"), Compare("/b", "version", ">", 0)],
        [Put("/x", b"s")],
        [Put("/x", b"f")],
    )
    assert not res.succeeded
    x = await store.get("/x")
    assert x is not None and x.value == b"f"


async def test_txn_get_ops(store: MetaStore) -> None:
    await store.put("/g/2", b"b")
    await store.put("/g/1", b"a")
    await store.put("/h", b"h")
    res = await store.txn(
        [], [Get("/g/", prefix=True), Get("/h"), Get("/missing"), Get("/none/", prefix=True)]
    )
    assert res.succeeded
    assert [[kv.key for kv in g] for g in res.gets] == [["/g/1", "/g/2"], ["/h"], [], []]
    assert res.gets[0][0].value == b"a"
    assert res.revision == (await store.put("/h", b"h2")) - 1  # read-only txn: no new revision


async def test_txn_limits(store: MetaStore) -> None:
    assert store.max_txn_ops == 128
    res = await store.txn([], [Put(f"/n/{i:03d}", b"x") for i in range(128)])
    assert res.succeeded and len(await store.range("/n/")) == 128
    with pytest.raises(MetaStoreError):
        await store.txn([], [Put(f"/m/{i:03d}", b"x") for i in range(129)])
    with pytest.raises(MetaStoreError):
        await store.txn([], [Put("/dup", b"1"), Put("/dup", b"2")])
    assert await store.range("/m/") == [] and await store.get("/dup") is None


# -------------------------------------------------------------------- leases


async def test_revoked_lease_takes_its_keys(store: MetaStore) -> None:
    lease = await store.grant_lease(30)
    await store.put("/live/a", b"a", lease=lease)
    await store.put("/live/b", b"b", lease=lease)
    await store.put("/keep", b"k")
    kv = await store.get("/live/a")
    assert kv is not None and kv.lease == lease
    assert await store.refresh_lease(lease) >= 1
    await store.revoke_lease(lease)
    assert await store.range("/live/") == []
    assert await store.get("/keep") is not None
    with pytest.raises(LeaseExpiredError):
        await store.refresh_lease(lease)
    with pytest.raises(LeaseExpiredError):
        await store.put("/live/c", b"c", lease=lease)
    await store.revoke_lease(lease)  # idempotent


async def test_lease_expiry_deletes_keys(store: MetaStore) -> None:
    lease = await store.grant_lease(1)
    rev = await store.put("/eph", b"x", lease=lease)
    watch = store.watch("/eph", start_revision=rev + 1)
    async with closing(watch):
        ev = await next_event(watch)
    assert (ev.type, ev.key) == ("delete", "/eph")
    assert await store.get("/eph") is None
    with pytest.raises(LeaseExpiredError):
        await store.refresh_lease(lease)


async def test_refresh_keeps_a_lease_alive(store: MetaStore) -> None:
    lease = await store.grant_lease(2)
    await store.put("/hb", b"x", lease=lease)
    assert await store.refresh_lease(lease) == 2
    kv = await store.get("/hb")
    assert kv is not None and kv.lease == lease
    await store.revoke_lease(lease)


# --------------------------------------------------------------------- watch


async def test_watch_from_start_revision_sees_puts_and_deletes_in_order(
    store: MetaStore,
) -> None:
    r1 = await store.put("/w/a", b"1")
    await store.put("/other", b"x")
    await store.put("/w/b", b"2")
    await store.delete("/w/a")
    res = await store.txn([], [Put("/w/c", b"3"), Delete("/w/b")])
    watch = store.watch("/w/", start_revision=r1)
    async with closing(watch):
        events = await collect(watch, 5)
        assert [(e.type, e.key, e.value) for e in events] == [
            ("put", "/w/a", b"1"),
            ("put", "/w/b", b"2"),
            ("delete", "/w/a", b""),
            ("put", "/w/c", b"3"),
            ("delete", "/w/b", b""),
        ]
        assert events[0].mod_revision == r1
        assert events[-1].mod_revision == events[-2].mod_revision == res.revision
        revs = [e.mod_revision for e in events]
        assert revs == sorted(revs)
        # and it keeps following new writes
        r_new = await store.put("/w/d", b"4")
        ev = await next_event(watch)
        assert (ev.type, ev.key, ev.mod_revision) == ("put", "/w/d", r_new)


async def test_watch_from_now_skips_earlier_writes(store: MetaStore) -> None:
    await store.put("/n/old", b"old")
    watch = store.watch("/n/")
    async with closing(watch):
        pending = asyncio.ensure_future(next_event(watch))
        await store.put("/n/new", b"new")
        ev = await pending
    assert (ev.type, ev.key, ev.value) == ("put", "/n/new", b"new")


async def test_watch_can_be_closed(store: MetaStore) -> None:
    r = await store.put("/c/a", b"1")
    watch = store.watch("/c/", start_revision=r)
    got: list[str] = []
    async for ev in watch:
        got.append(ev.key)
        break
    await cast(AsyncGenerator[WatchEvent, None], watch).aclose()
    assert got == ["/c/a"]
    # a watch whose consumer task is cancelled while waiting stops too
    watch2 = store.watch("/c/")
    task = asyncio.ensure_future(anext(watch2))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await cast(AsyncGenerator[WatchEvent, None], watch2).aclose()
    # the store is unaffected
    assert await store.put("/c/b", b"2") > r


async def test_closed_store_raises(store: MetaStore) -> None:
    await store.put("/x", b"1")
    await store.close()
    with pytest.raises(MetaStoreError):
        await store.get("/x")
    with pytest.raises(MetaStoreError):
        await store.put("/x", b"2")
    await store.close()  # idempotent
