"""The ObjectStore contract (tests/unit/segments/test_store_contract.py) against S3Store
on real S3 servers: moto's server and SeaweedFS.

The contract's tests (those taking ``store``) are imported here and collected again; this
module's ``store`` fixture replaces the unit module's (LocalStore) for them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from segments.s3_store import S3Store
from segments.store import ObjectStore, open_store
from tests.fixtures.s3 import create_bucket
from tests.unit.segments.test_store_contract import (  # noqa: F401 - the contract's tests
    test_concurrent_puts_one_winner,
    test_head_list_delete,
    test_if_match,
    test_list_paginates,
    test_missing_objects,
    test_put_if_absent_is_exclusive,
    test_ranged_gets,
)

pytestmark = pytest.mark.integration


@pytest.fixture(params=["moto", "seaweedfs"], ids=["s3-moto", "s3-seaweedfs"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[ObjectStore]:
    endpoint = request.getfixturevalue(f"{request.param}_s3")
    bucket = await asyncio.to_thread(create_bucket, endpoint)
    s = open_store(endpoint.store_url(bucket, "pfx/x"))
    assert isinstance(s, S3Store) and s.prefix == "pfx/x/"
    yield s
    await s.close()
