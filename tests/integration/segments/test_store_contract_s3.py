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
    test_put_all_each_item_alone,
    test_put_if_absent_is_exclusive,
    test_put_with_its_crc32c,
    test_range_keys_read_a_shared_objects_segment,
    test_ranged_gets,
)

pytestmark = pytest.mark.integration


@pytest.fixture(
    params=["moto", "seaweedfs", "seaweedfs-sdk-puts"],
    ids=["s3-moto", "s3-seaweedfs", "s3-seaweedfs-sdk-puts"],
)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[ObjectStore]:
    """Direct PUTs by default (segments/s3_direct_put.py); ``-sdk-puts``: the SDK's."""
    server, _, variant = request.param.partition("-")
    endpoint = request.getfixturevalue(f"{server}_s3")
    bucket = await asyncio.to_thread(create_bucket, endpoint)
    url = endpoint.store_url(bucket, "pfx/x")
    s = open_store(url + "&direct_puts=false" if variant else url)
    assert isinstance(s, S3Store) and s.prefix == "pfx/x/"
    assert (s._puts is None) == bool(variant)  # noqa: SLF001
    yield s
    await s.close()
