"""Coordinators over the real embedded metadata store, and a client-side join helper."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from broker.group_store import MetaGroupStore
from broker.meta.embedded import EmbeddedStore
from groupcoord import GroupConfig, GroupCoordinator, JoinRequest, JoinResult
from protocol.errors import ErrorCode

FAST = GroupConfig(min_session_timeout_ms=1, max_session_timeout_ms=60_000)


class Clock:
    """A settable wall clock (ms) for retention tests."""

    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


@dataclass
class Env:
    meta: EmbeddedStore
    store: MetaGroupStore
    clock: Clock
    make: Callable[..., GroupCoordinator]


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    meta = EmbeddedStore(str(tmp_path / "meta"))
    store = MetaGroupStore(meta)
    clock = Clock()
    made: list[GroupCoordinator] = []

    def make(config: GroupConfig = FAST) -> GroupCoordinator:
        coord = GroupCoordinator(store, config, clock_ms=clock)
        made.append(coord)
        return coord

    yield Env(meta, store, clock, make)
    for coord in made:
        await coord.stop()
    await meta.close()


@pytest.fixture
async def coord(env: Env) -> GroupCoordinator:
    c = env.make()
    await c.start()
    return c


def join_req(
    group: str = "g",
    member_id: str = "",
    protocols: tuple[tuple[str, bytes], ...] = (("range", b"m"),),
    session_ms: int = 10_000,
    rebalance_ms: int = 500,
    instance_id: str | None = None,
    protocol_type: str = "consumer",
    client_id: str = "c",
) -> JoinRequest:
    return JoinRequest(
        group,
        member_id,
        instance_id,
        client_id,
        "/127.0.0.1",
        session_ms,
        rebalance_ms,
        protocol_type,
        protocols,
    )


async def full_join(coord: GroupCoordinator, **kw: object) -> JoinResult:
    """JoinGroup v4+ as a client does it: get a member id, then join with it."""
    first = await coord.join_group(join_req(**kw))  # type: ignore[arg-type]
    if first.error is not ErrorCode.MEMBER_ID_REQUIRED:
        return first
    kw["member_id"] = first.member_id
    return await coord.join_group(join_req(**kw))  # type: ignore[arg-type]


T = TypeVar("T")


def spawn(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    return asyncio.ensure_future(coro)
