"""Unit tests start no etcd, no S3 server and no broker: those tests live under
tests/integration/ (marked ``integration``). Requesting one of the fixtures that start
them from a unit test is a collection error."""

from __future__ import annotations

from pathlib import Path

import pytest

# the session fixtures of tests/fixtures/ that start servers (the per-test ``broker``
# fixture is left out: its name is too common to tell it from a local fixture)
SERVER_FIXTURES = frozenset({"etcd_url", "moto_s3", "seaweedfs_s3", "shared_broker"})
UNIT_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    bad = [
        item.nodeid
        for item in items
        if UNIT_DIR in Path(str(item.path)).parents
        and SERVER_FIXTURES & set(getattr(item, "fixturenames", ()))
    ]
    if bad:
        raise pytest.UsageError(
            "unit tests must not start etcd, S3 servers or brokers (move them to "
            "tests/integration/): " + ", ".join(bad)
        )
