"""Retired segments send a DELETE only for objects that can exist (broker/deletion.py;
docs/format.md, "Merged segments and the log start"): a manifest entry records its
object's format version, so a version 2 segment (its index inside) gets no DELETE of an
``.index`` object, while entries that do not record it (written by an older broker) keep
both DELETEs. On an in-process broker over a real local-directory store and embedded
metadata store; the store's DELETE calls are counted."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from broker.meta.schema import SegmentMeta
from broker.server import Broker
from segments.format import SEGMENT_VERSION, index_key_for
from tests.unit.broker.maintenance_helpers import TOPIC, config, maint, objects, produce


def test_entry_records_its_format_version_and_old_entries_read_as_unknown() -> None:
    meta = SegmentMeta(0, 9, 100, 10, 5, "e", "k", 7, (), SEGMENT_VERSION)
    assert json.loads(meta.to_json())["version"] == SEGMENT_VERSION
    back = SegmentMeta.from_json(0, meta.to_json())
    assert back == meta and not back.has_index_object
    old = replace(meta, version=0)
    assert "version" not in json.loads(old.to_json())  # written as older brokers did
    read = SegmentMeta.from_json(0, old.to_json())
    assert read.version == 0 and read.has_index_object
    assert replace(meta, version=1).has_index_object  # version 1: the index beside it


@pytest.fixture
async def counted(tmp_path: Path) -> AsyncIterator[tuple[Broker, list[str]]]:
    b = Broker(config(tmp_path))
    await b.start()
    await b.topics.create(TOPIC, 1)
    deleted: list[str] = []
    store = b.logs.store
    real_delete = store.delete

    async def delete(key: str) -> None:
        deleted.append(key)
        await real_delete(key)

    store.delete = delete  # type: ignore[method-assign]
    try:
        yield b, deleted
    finally:
        await b.stop()


async def test_merged_away_version2_segments_get_one_delete_each(
    counted: tuple[Broker, list[str]], tmp_path: Path
) -> None:
    b, deleted = counted
    await produce(b.logs, 6)
    lg = await b.logs.get(TOPIC, 0)
    assert {s.version for s in lg.segments} == {SEGMENT_VERSION}
    entries = [json.loads(kv.value) for kv in await b.meta.range(f"/logs/{TOPIC}/0/segments/")]
    assert [e["version"] for e in entries] == [SEGMENT_VERSION] * 6  # in the manifest too
    old_keys = {b.logs.object_key(lg, s) for s in lg.segments}
    await maint(b).run_once()
    (merged,) = lg.segments
    assert merged.version == SEGMENT_VERSION
    await maint(b).flush_deletes()
    assert sorted(deleted) == sorted(old_keys)  # no DELETE of an .index that cannot exist
    assert objects(tmp_path) == {merged.key}


async def test_entries_without_a_version_keep_the_index_delete(
    counted: tuple[Broker, list[str]], tmp_path: Path
) -> None:
    """Entries loaded from an older broker's manifest (no ``version``): as before, the
    ``.index`` key is deleted too (it may exist)."""
    b, deleted = counted
    await produce(b.logs, 4)
    lg = await b.logs.get(TOPIC, 0)
    lg.set_segments([replace(s, version=0) for s in lg.segments])
    old_keys = {b.logs.object_key(lg, s) for s in lg.segments}
    await maint(b).run_once()
    await maint(b).flush_deletes()
    assert sorted(deleted) == sorted(old_keys | {index_key_for(k) for k in old_keys})
    assert objects(tmp_path) == {lg.segments[0].key}
