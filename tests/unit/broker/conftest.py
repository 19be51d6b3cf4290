"""Fixtures of the broker unit tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.meta.base import MetaStore, open_meta


@pytest.fixture
async def meta(tmp_path: Path) -> AsyncIterator[MetaStore]:
    """A real embedded metadata store in the test's directory (no process)."""
    store = open_meta("embedded", data_dir=str(tmp_path))
    try:
        yield store
    finally:
        await store.close()
