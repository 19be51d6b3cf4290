"""Helpers of the log maintenance tests (test_maintenance_*.py; also test_log_metrics.py
and test_retired_objects.py): an in-process broker's configuration with its loops idle,
committed segments of one partition, what they read back, and what the stores hold.
The ``node`` fixture is in conftest.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from broker.config import BrokerConfig
from broker.logs import LogManager
from broker.maintenance import Maintenance
from broker.partition import PartitionLog
from broker.server import Broker
from protocol.batch import iter_batches, read_header
from protocol.errors import ErrorCode
from protocol.records import build_batch, decode_batch
from segments.format import parse_object_name, partition_prefix
from tests.fixtures.inprocess import local_config

TOPIC = "maint"


def span(key: str) -> tuple[int, int | None]:
    """(base, last) of an object name."""
    parsed = parse_object_name(key)
    assert parsed is not None, key
    return parsed.base, parsed.last


def config(tmp: Path, **kw: Any) -> BrokerConfig:
    defaults: dict[str, Any] = {
        "merge_interval_ms": 3_600_000,  # the loop stays idle: tests drive run_once
        "retention_check_interval_ms": 3_600_000,
        "merge_min_age_ms": 0,
        "merge_min_segments": 2,
        "segment_delete_grace_ms": 0,
    }
    return local_config(tmp, **{**defaults, **kw})


def maint(b: Broker) -> Maintenance:
    assert b.logs.maintenance is not None
    return b.logs.maintenance


async def produce(logs: LogManager, n: int, ts: int | None = None, start: int = 0) -> None:
    """``n`` batches of two records, each committed (one segment each) before the next."""
    lg = await logs.get(TOPIC, 0)
    now = int(time.time() * 1000)
    for i in range(start, start + n):
        recs: list[Any] = [(f"k{i}".encode(), f"value-{i}-{j}".encode() * 3, []) for j in range(2)]
        view = memoryview(bytearray(build_batch(recs, timestamps=[ts or now] * 2)))
        res = lg.append(read_header(view), view)
        assert res.error == ErrorCode.NONE and res.done is not None
        logs.appended(lg, len(view))
        await res.done


async def read_all(logs: LogManager, lg: PartitionLog, start: int = 0) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    offset = start
    while offset < lg.hw:
        views = await logs.read(lg, offset, 1 << 20)
        assert views, f"nothing read at {offset}"
        for v in views:
            for _hdr, bv in iter_batches(v):
                for r in decode_batch(bv)[1]:
                    if r.offset >= offset:
                        assert r.value is not None
                        out.append((r.offset, r.value))
        offset = out[-1][0] + 1
    return out


def expected(n: int, start: int = 0) -> list[tuple[int, bytes]]:
    return [
        (2 * i + j, f"value-{i}-{j}".encode() * 3)
        for i in range(start, start + n)
        for j in range(2)
    ]


async def manifest(b: Broker) -> list[dict[str, object]]:
    kvs = await b.meta.range(f"/logs/{TOPIC}/0/segments/")
    return [json.loads(kv.value) for kv in kvs]


async def end_value(b: Broker) -> dict[str, int]:
    kv = await b.meta.get(f"/logs/{TOPIC}/0/end")
    assert kv is not None
    return dict(json.loads(kv.value))


def objects(tmp: Path) -> set[str]:
    d = tmp / "data" / partition_prefix("default", TOPIC, 0)
    return set(os.listdir(d)) if d.exists() else set()
