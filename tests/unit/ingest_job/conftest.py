"""Fixtures for the ingest job tests: a real local store + embedded metadata store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker.meta.base import MetaStore, open_meta
from segments.store import ObjectStore, open_store
from tests.unit.ingest_job.segdata import PartitionWriter, create_topic


@dataclass
class KafsEnv:
    data_dir: Path
    store_url: str
    store: ObjectStore
    meta: MetaStore

    async def topic(self, name: str, partitions: int = 1) -> list[PartitionWriter]:
        await create_topic(self.meta, name, partitions)
        return [PartitionWriter(self.store, self.meta, name, p) for p in range(partitions)]


@pytest.fixture
async def kafs_env(tmp_path: Path) -> AsyncIterator[KafsEnv]:
    data = tmp_path / "data"
    data.mkdir()
    store_url = f"file://{data}/segments"
    store = open_store(store_url)
    meta = open_meta("embedded", data_dir=str(data))
    try:
        yield KafsEnv(data, store_url, store, meta)
    finally:
        await meta.close()
        await store.close()
