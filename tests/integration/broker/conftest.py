"""Fixtures of the broker integration tests."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.meta.base import open_meta
from tests.integration.broker.topic_env import Env


@pytest.fixture(params=["embedded", "etcd"])
async def env(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Env]:
    """The TopicManager tests' store (topic_env.py), once embedded and once etcd."""
    prefix = f"/test-{uuid.uuid4().hex[:12]}"
    if request.param == "embedded":
        meta = open_meta("embedded", data_dir=str(tmp_path), prefix=prefix)
        other = meta  # one embedded store per data dir: brokers share the instance
    else:
        url = request.getfixturevalue("etcd_url")
        meta = open_meta(url, prefix=prefix)
        other = open_meta(url, prefix=prefix)
    e = Env(meta, other)
    try:
        yield e
    finally:
        for tm in e.managers:
            await tm.stop()
        await meta.close()
        if other is not meta:
            await other.close()
