"""The MetaStore contract (tests/unit/broker/meta/test_contract.py) against a real etcd.

The contract's tests are imported here and collected again; this module's ``backend``
fixture (etcd) replaces the unit module's (the embedded store) for them.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from broker.meta.base import MetaStore
from broker.meta.etcd import EtcdStore
from tests.unit.broker.meta.test_contract import *  # noqa: F403 - the contract's tests
from tests.unit.broker.meta.test_contract import Opener

pytestmark = pytest.mark.integration


@pytest.fixture  # type: ignore[no-redef]  # the contract's fixture, on etcd
async def backend(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[MetaStore, Opener]]:
    url = request.getfixturevalue("etcd_url")
    store = EtcdStore.from_url(url, prefix=f"/t{uuid.uuid4().hex}")
    opened: list[MetaStore] = []

    def other(p: str) -> MetaStore:
        opened.append(EtcdStore.from_url(url, prefix=p))
        return opened[-1]

    try:
        yield store, other
    finally:
        for s in opened:
            await s.close()
        await store.close()
