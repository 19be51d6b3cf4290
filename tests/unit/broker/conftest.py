"""Fixtures of the broker unit tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.meta.base import MetaStore, open_meta
from broker.server import Broker
from tests.unit.broker.maintenance_helpers import TOPIC, config


@pytest.fixture
async def meta(tmp_path: Path) -> AsyncIterator[MetaStore]:
    """A real embedded metadata store in the test's directory (no process)."""
    store = open_meta("embedded", data_dir=str(tmp_path))
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Broker]:
    """The maintenance tests' in-process broker (maintenance_helpers.py): loops idle, topic
    ``maint`` with one partition. test_compaction_passes.py has its own ``node``."""
    b = Broker(config(tmp_path))
    await b.start()
    await b.topics.create(TOPIC, 1)
    try:
        yield b
    finally:
        await b.stop()
