"""Property test of the real compactor (broker/compaction.py): passes, run until nothing
is left to do, leave the last record of every key at its offset."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.server import Broker
from tests.fixtures.inprocess import local_config
from tests.unit.broker.compaction_helpers import COMPACT, TOPIC, append, read_records


@settings(max_examples=30, deadline=None)
@given(
    segments=st.lists(
        st.lists(st.tuples(st.integers(0, 6), st.booleans()), min_size=1, max_size=6),
        min_size=1,
        max_size=8,
    ),
    capacity_keys=st.integers(1, 8),
    txn_ops=st.integers(3, 6),
    output_bytes=st.sampled_from([1, 1 << 20]),
)
def test_passes_of_the_compactor_leave_the_last_value_per_key(
    tmp_path_factory: pytest.TempPathFactory,
    segments: list[list[tuple[int, bool]]],
    capacity_keys: int,
    txn_ops: int,
    output_bytes: int,
) -> None:
    """The real compactor (small key map, small or large outputs, small transactions), run
    until it has nothing left to do, leaves exactly the last record of every key at its
    offset; with the tombstones' horizon passed, the live ones only."""
    import asyncio
    from dataclasses import replace

    from broker.compaction_policy import KEY_ENTRY_BYTES

    async def scenario(tmp: Path) -> None:
        # the background maintenance loop stays idle: it would compact concurrently with
        # the passes this test drives, and a pass that finds the manifest moved stops
        idle = {"merge_interval_ms": 3_600_000, "retention_check_interval_ms": 3_600_000}
        b = Broker(local_config(tmp, segment_delete_grace_ms=0, **idle))
        await b.start()
        try:
            await b.topics.create(TOPIC, 1, configs=COMPACT)
            await b.logs.get(TOPIC, 0)  # taken first: the take is a larger transaction
            b.meta.max_txn_ops = txn_ops
            last: dict[bytes, tuple[int, bytes | None]] = {}
            offset = 0
            for ops in segments:
                recs: list[Any] = []
                for k, dead in ops:
                    value = None if dead else b"v%d" % offset
                    recs.append((b"k%d" % k, value, []))
                    last[b"k%d" % k] = (offset, value)
                    offset += 1
                await append(b.logs, recs)
            lg = await b.logs.get(TOPIC, 0)
            assert b.logs.maintenance is not None
            comp = b.logs.maintenance.compactor
            comp.config = replace(
                b.config,
                compaction_buffer_bytes=capacity_keys * KEY_ENTRY_BYTES,
                merge_max_bytes=output_bytes,
            )
            ccfg = comp.topic_config(lg)
            assert ccfg is not None
            for _ in range(len(segments) + 2):
                if not await comp.compact(lg, ccfg):
                    break
            want = sorted((o, k, v) for k, (o, v) in last.items())
            start = offset - len(segments[-1])  # the log's last batch stays whole
            end_batch = [(start + i, b"k%d" % k, None if dead else b"v%d" % (start + i))
                         for i, (k, dead) in enumerate(segments[-1])]  # fmt: skip
            got = await read_records(b.logs, lg)
            assert [r for r in got if r[0] < start] == [w for w in want if w[0] < start]
            assert [r for r in got if r[0] >= start] == end_batch
            later = int(time.time() * 1000) + 86_400_000 + 1000
            while await comp.maybe_compact(lg, now_ms=later):
                pass
            got = await read_records(b.logs, lg)
            live = [w for w in want if w[0] < start and w[2] is not None]
            assert [r for r in got if r[0] < start] == live
            assert [r for r in got if r[0] >= start] == end_batch
        finally:
            await b.stop()

    asyncio.run(scenario(tmp_path_factory.mktemp("prop")))
