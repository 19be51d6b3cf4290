"""Helpers of the TopicManager tests (test_topics_*.py): managers over a metadata store
and a second client of it ("another broker"), error codes, waiting on the topic cache.
The ``env`` fixture (embedded and etcd) is in conftest.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from broker.config import BrokerConfig
from broker.meta.base import MetaStore
from broker.meta.schema import TopicInfo
from broker.topics import TopicManager
from protocol.errors import ErrorCode, KafkaProtocolError

WAIT = 5.0


@dataclass
class Env:
    meta: MetaStore
    other: MetaStore  # a second client of the same store ("another broker")
    managers: list[TopicManager] = field(default_factory=list)

    async def manager(self, config: BrokerConfig | None = None, **kw: object) -> TopicManager:
        tm = TopicManager(self.meta, config or BrokerConfig(default_partitions=3), **kw)  # type: ignore[arg-type]
        await tm.start()
        self.managers.append(tm)
        return tm

    async def second(self, config: BrokerConfig | None = None) -> TopicManager:
        tm = TopicManager(self.other, config or BrokerConfig(default_partitions=3))
        await tm.start()
        self.managers.append(tm)
        return tm


def code_of(exc: pytest.ExceptionInfo[KafkaProtocolError]) -> ErrorCode:
    return exc.value.code


async def until(tm: TopicManager, cond: Callable[[], bool]) -> None:
    """Wait until ``cond`` holds, re-checking it whenever ``tm``'s cache changes."""
    changed = asyncio.Event()

    def listener(_name: str, _info: TopicInfo | None) -> None:
        changed.set()

    tm.add_listener(listener)
    try:
        async with asyncio.timeout(WAIT):
            while not cond():
                await changed.wait()
                changed.clear()
    finally:
        tm.remove_listener(listener)
