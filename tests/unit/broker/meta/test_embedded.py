"""Embedded-store behaviour beyond the shared contract: durability, recovery, locking."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from broker.meta import wal
from broker.meta.base import Compare, Get, MetaStoreError, Put
from broker.meta.durable import LOG, SNAPSHOT
from broker.meta.embedded import EmbeddedStore


async def test_state_survives_close_and_reopen(tmp_path: Path) -> None:
    store = EmbeddedStore(str(tmp_path))
    await store.put("/a", b"1")
    await store.put("/a", b"2")
    await store.txn([], [Put("/b", b"x"), Put("/c", b"y")])
    await store.delete("/c")
    before = await store.range("")
    rev = store.revision
    await store.close()

    again = EmbeddedStore(str(tmp_path))
    try:
        assert await again.range("") == before
        assert again.revision == rev
        a = await again.get("/a")
        assert a is not None and (a.value, a.version) == (b"2", 2)
        assert await again.put("/d", b"z") == rev + 1
    finally:
        await again.close()


async def test_torn_tail_is_dropped_and_truncated(tmp_path: Path) -> None:
    store = EmbeddedStore(str(tmp_path))
    await store.put("/a", b"1")
    await store.put("/b", b"2")
    size_two = os.path.getsize(tmp_path / LOG)
    await store.put("/c", b"3" * 100)
    await store.close()
    full = os.path.getsize(tmp_path / LOG)
    os.truncate(tmp_path / LOG, full - 20)  # crash in the middle of the third record

    again = EmbeddedStore(str(tmp_path))
    try:
        assert [kv.key for kv in await again.range("")] == ["/a", "/b"]
        assert again.revision == 2
        assert os.path.getsize(tmp_path / LOG) == size_two
        assert await again.put("/d", b"4") == 3
    finally:
        await again.close()
    third = EmbeddedStore(str(tmp_path))
    try:
        assert [kv.key for kv in await third.range("")] == ["/a", "/b", "/d"]
    finally:
        await third.close()


async def test_corrupt_tail_record_is_ignored(tmp_path: Path) -> None:
    store = EmbeddedStore(str(tmp_path))
    await store.put("/a", b"1")
    await store.close()
    with open(tmp_path / LOG, "ab") as f:  # a whole frame whose checksum is wrong
        f.write(wal.encode_record(2, [wal.LogOp("/kafscale/b", b"2")])[:-1] + b"!")
    again = EmbeddedStore(str(tmp_path))
    try:
        assert [kv.key for kv in await again.range("")] == ["/a"]
    finally:
        await again.close()


async def test_lock_prevents_a_second_writer(tmp_path: Path) -> None:
    store = EmbeddedStore(str(tmp_path))
    with pytest.raises(MetaStoreError, match="in use by another process"):
        EmbeddedStore(str(tmp_path))
    await store.close()
    again = EmbeddedStore(str(tmp_path))
    await again.close()


async def test_compaction_keeps_data(tmp_path: Path) -> None:
    store = EmbeddedStore(str(tmp_path), compact_bytes=2048)
    for i in range(200):
        await store.put(f"/k/{i % 50:02d}", f"v{i}".encode())
    assert os.path.exists(tmp_path / SNAPSHOT)
    # the log stays within compact_bytes or twice the snapshot, whichever is more, plus
    # the few records written while the snapshot task waited for the write lock
    bound = max(2048, 2 * os.path.getsize(tmp_path / SNAPSHOT))
    assert os.path.getsize(tmp_path / LOG) <= bound + 300
    expected = await store.range("")
    await store.close()

    again = EmbeddedStore(str(tmp_path))
    try:
        assert await again.range("") == expected
        assert again.revision == 200
        kv = await again.get("/k/00")
        assert kv is not None and (kv.value, kv.version) == (b"v150", 4)
        with pytest.raises(MetaStoreError, match="compacted"):
            await anext(again.watch("/k/", start_revision=1))
    finally:
        await again.close()


async def test_leased_keys_do_not_survive_reopen(tmp_path: Path) -> None:
    store = EmbeddedStore(str(tmp_path))
    lease = await store.grant_lease(60)
    await store.put("/brokers/1", b"me", lease=lease)
    await store.put("/topics/t", b"t")
    await store.compact()  # the leased key is in the snapshot too
    await store.put("/owners/t/0", b"me", lease=lease)
    await store.close()

    again = EmbeddedStore(str(tmp_path))
    try:
        assert [kv.key for kv in await again.range("")] == ["/topics/t"]
    finally:
        await again.close()


async def test_read_only_rejects_writes_and_keeps_torn_tail(tmp_path: Path) -> None:
    store = EmbeddedStore(str(tmp_path))
    await store.put("/a", b"1")
    await store.put("/b", b"2")
    await store.close()
    size = os.path.getsize(tmp_path / LOG)
    os.truncate(tmp_path / LOG, size - 3)

    reader = EmbeddedStore(str(tmp_path), read_only=True)
    try:
        assert [kv.key for kv in await reader.range("")] == ["/a"]
        for call in (
            reader.put("/x", b"1"),
            reader.delete("/a"),
            reader.txn([], [Put("/x", b"1")]),
            reader.grant_lease(5),
            reader.refresh_lease(1),
            reader.revoke_lease(1),
        ):
            with pytest.raises(MetaStoreError, match="read-only"):
                await call
        assert (await reader.txn([], [])).succeeded  # reads are fine
    finally:
        await reader.close()
    assert os.path.getsize(tmp_path / LOG) == size - 3


def test_read_only_replay_races_compaction(tmp_path: Path) -> None:
    writer = EmbeddedStore(str(tmp_path), compact_bytes=1 << 30)
    done = threading.Event()

    def write() -> None:
        try:
            for i in range(400):
                asyncio.run(writer.put(f"/k/{i:04d}", b"x" * 50))
                if i % 7 == 0:
                    asyncio.run(writer.compact())
        finally:
            done.set()

    thread = threading.Thread(target=write)
    thread.start()
    opens = 0
    try:
        while not done.is_set() or opens < 5:
            reader = EmbeddedStore(str(tmp_path), read_only=True)
            keys = [kv.key for kv in asyncio.run(reader.range("/k/"))]
            # always a consistent prefix of the writer's history
            assert keys == [f"/k/{i:04d}" for i in range(len(keys))]
            assert reader.revision == len(keys)
            asyncio.run(reader.close())
            opens += 1
    finally:
        thread.join()
        asyncio.run(writer.close())
    assert opens >= 5


def slow_disk(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Make the log's appends wait until released: (entered, release) - ``entered`` is
    set when an append is waiting; once ``release`` is set, appends go through."""
    from broker.meta.durable import MetaDir

    entered, release = threading.Event(), threading.Event()
    real = MetaDir.append

    def slow_append(self: MetaDir, record: bytes) -> None:
        if not release.is_set():
            entered.set()
            assert release.wait(30), "the test never released the disk"
        real(self, record)

    monkeypatch.setattr(MetaDir, "append", slow_append)
    return entered, release


async def test_a_write_waits_on_the_disk_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log's append + fdatasync runs in a worker thread: while the disk is slow the
    loop serves reads, which see the write only once it is durable; writes queue behind
    it in order and compare against what the earlier write made durable."""
    from broker.meta.base import Compare

    store = EmbeddedStore(str(tmp_path))
    await store.put("/k", b"old")
    entered, release = slow_disk(monkeypatch)
    try:
        first = asyncio.ensure_future(store.put("/k", b"new"))
        assert await asyncio.to_thread(entered.wait, 30)
        # the loop runs: a read answers at once, with the value that is durable
        kv = await asyncio.wait_for(store.get("/k"), 10)
        assert kv is not None and kv.value == b"old"
        # a compare-and-set on the old value queues behind the first write and fails
        cas = asyncio.ensure_future(
            store.txn([Compare("/k", "value", "==", b"old")], [Put("/k", b"lost")])
        )
        await asyncio.sleep(0)
        assert not first.done() and not cas.done()
        release.set()
        rev = await asyncio.wait_for(first, 30)
        res = await asyncio.wait_for(cas, 30)
        assert not res.succeeded and res.revision == rev
        kv = await store.get("/k")
        assert kv is not None and kv.value == b"new" and kv.mod_revision == rev
    finally:
        release.set()
        await store.close()
    again = EmbeddedStore(str(tmp_path))  # and it was durable
    try:
        kv = await again.get("/k")
        assert kv is not None and kv.value == b"new"
    finally:
        await again.close()


async def test_a_cancelled_write_still_lands_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller cancelled while its write waits on the disk: the append goes on and is
    applied before any later write (then the caller sees CancelledError), so revisions
    stay unique and memory and replay agree."""

    store = EmbeddedStore(str(tmp_path))
    rev0 = await store.put("/k", b"0")
    entered, release = slow_disk(monkeypatch)
    try:
        caller = asyncio.ensure_future(store.put("/k", b"1"))
        assert await asyncio.to_thread(entered.wait, 30)
        caller.cancel()  # takes effect once the append it started is done and applied
        later = asyncio.ensure_future(store.put("/j", b"2"))
        await asyncio.sleep(0)
        assert not caller.done() and not later.done()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(caller, 30)
        assert await asyncio.wait_for(later, 30) == rev0 + 2
        kv = await store.get("/k")
        assert kv is not None and kv.value == b"1" and kv.mod_revision == rev0 + 1
    finally:
        release.set()
        await store.close()
    again = EmbeddedStore(str(tmp_path))
    try:
        assert again.revision == rev0 + 2
        kv = await again.get("/k")
        assert kv is not None and kv.value == b"1" and kv.mod_revision == rev0 + 1
    finally:
        await again.close()


def counting_slow_disk(
    monkeypatch: pytest.MonkeyPatch, fail_call: int = 0
) -> tuple[threading.Event, threading.Event, list[int]]:
    """``slow_disk`` that also counts the appends (each is one fdatasync) and the
    records' sizes; the ``fail_call``-th append (1-based; 0: none) fails as a full disk."""
    from broker.meta.durable import MetaDir

    entered, release = threading.Event(), threading.Event()
    sizes: list[int] = []
    real = MetaDir.append

    def slow_append(self: MetaDir, record: bytes) -> None:
        if not release.is_set():
            entered.set()
            assert release.wait(30), "the test never released the disk"
        sizes.append(len(record))
        if len(sizes) == fail_call:
            raise MetaStoreError("metadata log write failed: [Errno 28] injected")
        real(self, record)

    monkeypatch.setattr(MetaDir, "append", slow_append)
    return entered, release, sizes


async def test_queued_writes_on_disjoint_keys_share_one_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit: writes queued behind a slow append go to disk together, each as its
    own revision, up to the first that touches a key an earlier one of the group does;
    memory and replay agree."""
    store = EmbeddedStore(str(tmp_path))
    rev0 = await store.put("/b", b"0")
    entered, release, sizes = counting_slow_disk(monkeypatch)
    try:
        first = asyncio.ensure_future(store.put("/a", b"1"))
        assert await asyncio.to_thread(entered.wait, 30)
        queued = [
            asyncio.ensure_future(
                store.txn([Compare("/b", "value", "==", b"0")], [Put("/b", b"2")])
            ),
            asyncio.ensure_future(store.txn([], [Put("/c", b"3"), Put("/d", b"4")])),
            asyncio.ensure_future(
                store.txn([Compare("/e", "version", "==", 0)], [Put("/e", b"5")])
            ),
            # /b again: the next group, where it compares against the first one's write
            asyncio.ensure_future(
                store.txn([Compare("/b", "value", "==", b"0")], [Put("/b", b"6")])
            ),
            asyncio.ensure_future(store.txn([], [Get("/c")])),
        ]
        await asyncio.sleep(0)
        release.set()
        assert await asyncio.wait_for(first, 30) == rev0 + 1
        results = [await asyncio.wait_for(q, 30) for q in queued]
    finally:
        release.set()
        await store.close()
    assert [r.succeeded for r in results] == [True, True, True, False, True]
    assert [r.revision for r in results[:3]] == [rev0 + 2, rev0 + 3, rev0 + 4]
    assert results[4].gets[0][0].value == b"3"
    assert len(sizes) == 2  # the first write, then one append for the four queued after it
    again = EmbeddedStore(str(tmp_path))
    try:
        assert again.revision == rev0 + 4
        got = {k: (await again.get(k)) for k in ("/a", "/b", "/c", "/d", "/e")}
        assert {k: (kv.value, kv.mod_revision) for k, kv in got.items() if kv} == {
            "/a": (b"1", rev0 + 1),
            "/b": (b"2", rev0 + 2),
            "/c": (b"3", rev0 + 3),
            "/d": (b"4", rev0 + 3),
            "/e": (b"5", rev0 + 4),
        }
    finally:
        await again.close()


async def test_a_failed_group_append_fails_every_write_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One failed append: every write of its group raises MetaStoreError and none is
    applied (nor replayed); a read-only transaction of the group is answered; the store
    writes again afterwards at the next revision."""
    store = EmbeddedStore(str(tmp_path))
    rev0 = await store.put("/k", b"0")
    entered, release, _sizes = counting_slow_disk(monkeypatch, fail_call=2)
    try:
        first = asyncio.ensure_future(store.put("/a", b"1"))
        assert await asyncio.to_thread(entered.wait, 30)
        writes = [asyncio.ensure_future(store.put(f"/w{i}", b"x")) for i in range(3)]
        read = asyncio.ensure_future(store.txn([Compare("/k", "value", "==", b"0")], [Get("/k")]))
        await asyncio.sleep(0)
        release.set()
        assert await asyncio.wait_for(first, 30) == rev0 + 1
        for w in writes:
            with pytest.raises(MetaStoreError, match="injected"):
                await asyncio.wait_for(w, 30)
        res = await asyncio.wait_for(read, 30)
        assert res.succeeded and res.gets[0][0].value == b"0"
        assert await store.range("/w") == []
        assert await store.put("/after", b"y") == rev0 + 2
    finally:
        release.set()
        await store.close()
    again = EmbeddedStore(str(tmp_path))
    try:
        assert again.revision == rev0 + 2 and await again.range("/w") == []
    finally:
        await again.close()


async def test_transactions_sent_together_are_one_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flush cycle's commit chunks, sent together to an idle store, cost one append
    (one fdatasync), not one each."""
    store = EmbeddedStore(str(tmp_path))
    _entered, release, sizes = counting_slow_disk(monkeypatch)
    release.set()
    try:
        results = await asyncio.gather(
            *(
                store.txn([], [Put(f"/chunk{i}/a", b"x"), Put(f"/chunk{i}/b", b"y")])
                for i in range(3)
            )
        )
        assert sorted(r.revision for r in results) == [1, 2, 3]
        assert len(sizes) == 1
    finally:
        await store.close()
