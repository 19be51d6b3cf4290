"""Shared helpers for the segments tests: real v2 record batches."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import pytest

with warnings.catch_warnings():  # kafka-python 3.0.12 uses importlib.resources.read_text
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatchBuilder

from protocol.batch import set_base_offset
from segments.format import SEGMENT_VERSION, BuiltSegment
from segments.writer import build_segment

BASE_TS = 1_700_000_000_000


def make_batch(
    base_offset: int, count: int, compression: int = 0, ts: int = BASE_TS, value_size: int = 20
) -> bytearray:
    """One v2 batch of ``count`` records built by kafka-python, offset-patched."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    for i in range(count):
        value = (f"value-{base_offset + i}-".encode() * value_size)[:value_size]
        builder.append(i, timestamp=ts + i, key=f"k{i}".encode(), value=value, headers=[])
    buf = builder.build()
    set_base_offset(buf, base_offset)
    return buf


def make_batches(base_offset: int, sizes: Sequence[int], **kw: int) -> list[bytearray]:
    out = []
    offset = base_offset
    for n in sizes:
        out.append(make_batch(offset, n, ts=BASE_TS + offset, **kw))
        offset += n
    return out


def make_segment(
    base_offset: int,
    sizes: Sequence[int],
    index_interval: int = 100,
    version: int = SEGMENT_VERSION,
    **kw: int,
) -> tuple[BuiltSegment, bytes]:
    """A segment of real batches; ``version`` 1 is the legacy layout (index beside it)."""
    batches = make_batches(base_offset, sizes, **kw)
    built = build_segment(
        base_offset,
        [memoryview(b) for b in batches],
        created_ms=BASE_TS,
        index_interval=index_interval,
        version=version,
    )
    return built, b"".join(built.buffers)


@pytest.fixture
def segment_factory():
    return make_segment
