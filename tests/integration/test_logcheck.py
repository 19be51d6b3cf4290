"""``check_partition`` (tests/integration/logcheck.py) is what the durability tests lean
on, so it must fail on a broken partition: a real broker writes the partition on the
embedded defaults and is stopped; then a segment object is damaged or removed. The manifest
holds still, so the check fails after reading it twice (the read it checked and the one
that shows nothing changed), without the repeats it makes for a manifest in motion."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

import tests.integration.logcheck as logcheck
from segments.store import StoreError
from tests.fixtures.broker import start_broker
from tests.integration.backends import make_backend
from tests.integration.logcheck import Backend, check_partition

pytestmark = pytest.mark.integration
TOPIC = "checked"
RECORDS = 300


@pytest.fixture
def written(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    backend = make_backend(request, "local", tmp_path / "b")
    broker = start_broker(
        tmp_path / "b", store_url=backend.store_url, extra_args=backend.broker_args()
    )
    try:
        p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all",
                      "batch.num.messages": 50, "linger.ms": 0})  # fmt: skip
        for i in range(RECORDS):
            p.produce(TOPIC, value=b"v%06d" % i, partition=0)
            if i % 50 == 49:
                assert p.flush(30) == 0  # several batches, so several segments at most
        assert p.flush(30) == 0
    finally:
        broker.stop()
    yield backend


def _reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the manifest reads ``check_partition`` makes."""
    count = [0]
    real = logcheck._read_meta

    async def counted(*args: object) -> tuple[dict, list]:
        count[0] += 1
        return await real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(logcheck, "_read_meta", counted)
    return count


def _object_path(backend: Backend, key: str) -> Path:
    return Path(backend.store_url.removeprefix("file://"), *key.split("/"))


def test_a_sound_partition_passes_on_the_first_read(
    written: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = _reads(monkeypatch)
    state = check_partition(written, TOPIC, 0)
    assert state.next_offset == RECORDS
    assert reads == [1]


def test_a_damaged_segment_fails_the_check(
    written: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = check_partition(written, TOPIC, 0).keys[-1]
    path = _object_path(written, key)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte in the middle of the records, flipped
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))
    reads = _reads(monkeypatch)
    with pytest.raises(AssertionError):
        check_partition(written, TOPIC, 0)
    assert reads == [2]


def test_a_missing_segment_fails_the_check(
    written: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = check_partition(written, TOPIC, 0).keys[0]
    _object_path(written, key).unlink()
    reads = _reads(monkeypatch)
    with pytest.raises((AssertionError, StoreError)):
        check_partition(written, TOPIC, 0)
    assert reads == [2]
