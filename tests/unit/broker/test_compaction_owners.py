"""A compacted log for the next owner (broker/compaction.py): producer state,
DeleteRecords and ListOffsets after a pass and a restart, and `partitions truncate`
keeping a compacted segment compacted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from broker.server import Broker
from protocol.batch import read_header
from protocol.errors import ErrorCode
from protocol.records import build_batch
from tests.fixtures.inprocess import local_config
from tests.unit.broker.compaction_helpers import COMPACT, TOPIC, append, read_records


async def test_producer_state_delete_records_and_list_offsets_after_compaction(
    tmp_path: Path,
) -> None:
    from broker.handlers.list_offsets import _by_timestamp, _max_timestamp

    cfg = local_config(tmp_path, segment_delete_grace_ms=0)
    b = Broker(cfg)
    await b.start()
    try:
        await b.topics.create(TOPIC, 1, configs=COMPACT)
        pid: dict[str, Any] = {"producer_id": 5, "producer_epoch": 0}
        ab: list[Any] = [(b"a", b"1", []), (b"b", b"1", [])]
        await append(b.logs, ab, base_sequence=0, timestamps=[100, 101], **pid)
        await append(b.logs, ab, base_sequence=2, timestamps=[200, 201], **pid)  # 2..3
        await append(b.logs, [(b"a", b"2", []), (b"b", b"2", [])], timestamps=[300, 301])
        await append(b.logs, [(b"c", b"1", [])], timestamps=[400])
        lg = await b.logs.get(TOPIC, 0)
        assert b.logs.maintenance is not None
        comp = b.logs.maintenance.compactor
        ccfg = comp.topic_config(lg)
        assert ccfg is not None and await comp.compact(lg, ccfg)
        assert [r[0] for r in await read_records(b.logs, lg)] == [4, 5, 6]
        # ListOffsets by time finds the first remaining record at or after it
        assert await _by_timestamp(b.logs, lg, 150) == (4, 300)
        assert await _max_timestamp(b.logs, lg) == (6, 400)
    finally:
        await b.stop()
    b = Broker(cfg)  # the next owner rebuilds producer state from the compacted log
    await b.start()
    try:
        lg = await b.logs.get(TOPIC, 0)
        view = memoryview(bytearray(build_batch(ab, base_sequence=2, **pid)))
        res = lg.append(read_header(view), view)  # a retry of the last batch: a duplicate
        assert (res.error, res.base_offset) == (ErrorCode.NONE, 2)
        assert lg.next_offset == 7
        view = memoryview(bytearray(build_batch(ab, base_sequence=5, **pid)))
        res = lg.append(read_header(view), view)  # a gap after it
        assert res.error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        # DeleteRecords inside the compacted segment
        assert b.logs.maintenance is not None
        assert await b.logs.maintenance.delete_records(lg, 5) == 5
        assert [r[0] for r in await read_records(b.logs, lg) if r[0] >= 5] == [5, 6]
        assert lg.log_start == 5
    finally:
        await b.stop()


async def test_partitions_truncate_keeps_a_compacted_segment_compacted(tmp_path: Path) -> None:
    from broker.meta.base import open_meta
    from broker.repair import Target, truncate
    from segments.store import open_store

    cfg = local_config(tmp_path)
    b = Broker(cfg)
    await b.start()
    try:
        await b.topics.create(TOPIC, 1, configs=COMPACT)
        for v in range(3):  # offsets 3v..3v+2: a, b, c_v; a and b superseded until v=2
            await append(
                b.logs, [(b"a", b"%d" % v, []), (b"b", b"%d" % v, []), (b"c%d" % v, b"c", [])]
            )
        lg = await b.logs.get(TOPIC, 0)
        assert b.logs.maintenance is not None
        comp = b.logs.maintenance.compactor
        ccfg = comp.topic_config(lg)
        assert ccfg is not None and await comp.compact(lg, ccfg)
        assert [r[0] for r in await read_records(b.logs, lg)] == [2, 5, 6, 7, 8]
    finally:
        await b.stop()
    meta = open_meta("embedded", cfg.data_dir)
    store = open_store(cfg.store_url)
    try:  # cut at the start of the last batch (6): the segment keeps its gaps
        done = await truncate(meta, store, Target("default", TOPIC, 0), 6, execute=True)
        assert done[-1].endswith("now ends at 6")
    finally:
        await store.close()
        await meta.close()
    b = Broker(cfg)
    await b.start()
    try:
        lg = await b.logs.get(TOPIC, 0)
        assert lg.hw == 6 and lg.segments[0].cleaned
        assert [r[0] for r in await read_records(b.logs, lg)] == [2, 5]
    finally:
        await b.stop()
