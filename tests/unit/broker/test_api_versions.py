"""ApiVersions like a Kafka 4.0 broker's (issue 12): features, the versions kafka-python
infers 4.0 from, and every advertised version of every route really answered."""

from __future__ import annotations

import importlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kafka.protocol.broker_version_data import infer_broker_version_from_api_versions
from kafka.protocol.metadata import ApiVersionsRequest

from broker.handlers.routes import build_routes
from broker.server import Broker
from protocol.apis import ApiKey
from protocol.codec import max_known_version, request_class
from protocol.errors import ErrorCode
from tests.fixtures.inprocess import local_config
from tests.unit.broker.wire_client import WireClient


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[WireClient]:
    b = Broker(local_config(tmp_path))
    await b.start()
    c = await WireClient.connect(b.port)
    try:
        yield c
    finally:
        await c.close()
        await b.stop()


def _request() -> ApiVersionsRequest:
    return ApiVersionsRequest(client_software_name="t", client_software_version="1")


async def test_kafka_python_infers_4_0_and_features(client: WireClient) -> None:
    resp = await client.call(_request(), 4)
    assert resp.error_code == 0
    served = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
    assert infer_broker_version_from_api_versions(served) == (4, 0)
    supported = {f.name: (f.min_version, f.max_version) for f in resp.supported_features}
    assert supported["metadata.version"] == (7, 25)
    finalized = {
        f.name: (f.min_version_level, f.max_version_level) for f in resp.finalized_features
    }
    assert finalized["metadata.version"] == (25, 25)
    group = 1 if ApiKey.CONSUMER_GROUP_HEARTBEAT in served else 0
    assert supported["group.version"] == (0, group)
    assert finalized.get("group.version", (0, 0)) == (group, group)
    assert resp.finalized_features_epoch >= 0
    # below v4, features with a minimum level of 0 are left out (KAFKA-17492)
    v3 = await client.call(_request(), 3)
    assert "group.version" not in {f.name for f in v3.supported_features}
    assert {f.name for f in v3.finalized_features} == set(finalized)
    # v0-v2 have no feature fields at all, and still answer
    assert (await client.call(_request(), 2)).error_code == 0


_RANGE = r"\((?:key )?{key}\),? (?:versions? |v)(\d+)(?:-(\d+))?"


def test_every_route_states_its_versions_and_kafka_python_knows_them() -> None:
    for key, route in build_routes().items():
        if route.decode is None:  # decoded by kafka-python's classes
            assert route.max_version <= max_known_version(key), ApiKey(key).name
        doc = importlib.import_module(route.handle.__module__).__doc__ or ""
        doc = " ".join(doc.split())
        m = re.search(_RANGE.format(key=key), doc)
        assert m, f"{route.handle.__module__} docstring states no versions for key {key}"
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        assert (lo, hi) == (route.min_version, route.max_version), ApiKey(key).name


async def test_every_advertised_version_answers(client: WireClient) -> None:
    """Each route at its lowest and highest version: a default request decodes, the
    handler answers without failing, and the response decodes at that version."""
    for key, route in sorted(build_routes().items()):
        cls = request_class(key)
        for version in sorted({route.min_version, route.max_version}):
            req = cls()
            if key == ApiKey.PRODUCE:
                req.acks = 1  # acks=0 (the default) is never answered
            resp = await client.call(req, version)
            code = getattr(resp, "error_code", 0)
            assert code != ErrorCode.UNKNOWN_SERVER_ERROR, (ApiKey(key).name, version)
