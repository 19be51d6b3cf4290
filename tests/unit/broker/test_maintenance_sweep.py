"""Object names and the sweeps that judge objects by them (broker/maintenance.py) on an
in-process broker over a real local-directory store and a real embedded metadata
store: what a new owner deletes, the grace, a fenced sweeper, a recreated topic."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

from broker.server import Broker
from segments.format import object_name, parse_object_name, partition_prefix
from segments.store import open_store
from tests.unit.broker.maintenance_helpers import (
    TOPIC,
    config,
    expected,
    maint,
    objects,
    produce,
    read_all,
)


def test_object_names() -> None:
    import uuid

    tid = uuid.UUID("0123456789abcdef0123456789abcdef")
    name = object_name(5, 17, 3, tid, 42)
    assert (
        name
        == "segment-00000000000000000005-00000000000000000017-e0000000003-01234567-000000000042.kfs"
    )
    parsed = parse_object_name(name)
    assert parsed is not None
    assert (parsed.base, parsed.last, parsed.epoch, parsed.topic_tag, parsed.seq) == (
        5,
        17,
        3,
        "01234567",
        42,
    )
    assert parse_object_name(name[:-4] + ".index") == replace(parsed, index=True)
    # the legacy names are still read
    legacy = parse_object_name("segment-00000000000000000005-00000000000000000017.index")
    assert legacy is not None and (legacy.base, legacy.last, legacy.epoch) == (5, 17, None)
    plain = parse_object_name("segment-00000000000000000042.kfs")
    assert plain is not None and (plain.base, plain.last, plain.epoch) == (42, None, None)
    assert parse_object_name("segment-42.kfs") is None
    assert parse_object_name("notes.txt") is None
    assert parse_object_name(name.replace("-e0", "-x0")) is None


async def test_new_owner_sweeps_only_what_no_writer_can_still_commit(tmp_path: Path) -> None:
    b = Broker(config(tmp_path))
    await b.start()
    await b.topics.create(TOPIC, 1)
    await produce(b.logs, 4)
    old = await b.logs.get(TOPIC, 0)
    tid = old.topic_id
    await b.stop()
    prefix = partition_prefix("default", TOPIC, 0)
    store = open_store(f"file://{tmp_path}/data")
    gone = {
        "segment-00000000000000000000-00000000000000000005.kfs",  # legacy merge, unreferenced
        "segment-00000000000000000001.kfs",  # legacy plain
        object_name(0, 5, old.epoch, tid, 99),  # the previous owner's uncommitted merge
    }
    kept = {
        object_name(8, 9, old.epoch + 1, tid, 1),  # the new owner's own (outcome unknown)
        object_name(8, 9, old.epoch + 5, tid, 1),  # a newer owner's
        "notes.txt",
    }
    for name in gone | kept:
        await store.put_if_absent(prefix + name, [b"x"])
    await store.close()
    b2 = Broker(config(tmp_path, merge_interval_ms=0))
    await b2.start()
    try:
        lg = await b2.logs.get(TOPIC, 0)
        assert lg.epoch == old.epoch + 1
        await maint(b2).run_once()  # grace 0: the sweep is due at once
        names = objects(tmp_path)
        assert not gone & names
        assert kept <= names
        assert {s.key for s in lg.segments} <= names
        assert await read_all(b2.logs, lg) == expected(4)
    finally:
        await b2.stop()


async def test_sweep_spares_objects_younger_than_the_grace(tmp_path: Path) -> None:
    """Age counts from the object's own creation time, not from when a sweeper saw it."""
    b = Broker(config(tmp_path))
    await b.start()
    await b.topics.create(TOPIC, 1)
    await produce(b.logs, 2)
    await b.stop()
    prefix = partition_prefix("default", TOPIC, 0)
    store = open_store(f"file://{tmp_path}/data")
    young, aged = "segment-00000000000000000007.kfs", "segment-00000000000000000009.kfs"
    for name in (young, aged):
        await store.put_if_absent(prefix + name, [b"x"])
    await store.close()
    path = tmp_path / "data" / prefix / aged
    os.utime(path, (time.time() - 7200, time.time() - 7200))
    b2 = Broker(config(tmp_path, merge_interval_ms=0, segment_delete_grace_ms=3_600_000))
    await b2.start()
    try:
        lg = await b2.logs.get(TOPIC, 0)
        assert await maint(b2).sweep(lg) == 1
        names = objects(tmp_path)
        assert young in names and aged not in names
    finally:
        await b2.stop()


async def test_a_fenced_sweeper_deletes_nothing(tmp_path: Path) -> None:
    b = Broker(config(tmp_path))
    await b.start()
    try:
        await b.topics.create(TOPIC, 1)
        await produce(b.logs, 2)
        lg = await b.logs.get(TOPIC, 0)
        prefix = partition_prefix("default", TOPIC, 0)
        stray = object_name(0, 1, lg.epoch - 1 if lg.epoch > 1 else 0, lg.topic_id, 5)
        await b.store.put_if_absent(prefix + stray, [b"x"])
        await b.meta.put(f"/owners/{TOPIC}/0", b'{"broker":9,"epoch":99}')  # taken over
        assert await maint(b).sweep(lg) == 0
        assert stray in objects(tmp_path) and lg.state == "closed"
    finally:
        await b.stop()


async def test_pending_deletions_spare_a_recreated_topic(tmp_path: Path) -> None:
    b = Broker(config(tmp_path, segment_delete_grace_ms=3_600_000))
    await b.start()
    try:
        await b.topics.create(TOPIC, 1)
        await produce(b.logs, 4)
        first = (await b.logs.get(TOPIC, 0)).segments[0].key
        await maint(b).run_once()  # the merged-away objects wait for deletion
        assert any(k.endswith(first) for k in maint(b).pending_deletes)
        await b.topics.delete(TOPIC)
        await b.topics.wait_background()
        await b.topics.create(TOPIC, 1)
        await produce(b.logs, 1)  # the new topic's first segment, at base 0 again
        await maint(b).flush_deletes()
        lg = await b.logs.get(TOPIC, 0)
        assert lg.segments[0].key in objects(tmp_path)
        assert await read_all(b.logs, lg) == expected(1)
    finally:
        await b.stop()
