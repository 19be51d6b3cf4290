"""The registry on a 3-broker cluster over a real etcd (docs/registry.md).

Each broker serves the registry from the shared metadata store: a schema registered
through one broker is served by the others, concurrent registrations through all three
get distinct ids, one id per distinct schema, and ids are never reused after deletes.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.fixtures.broker import BrokerProcess, free_port, start_broker
from tests.integration.registry.test_registry import http

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, etcd_url: str) -> Iterator[list[str]]:
    tmp: Path = tmp_path_factory.mktemp("registry-cluster")
    prefix = f"/reg-{uuid.uuid4().hex[:8]}"
    brokers: list[BrokerProcess] = []
    urls = []
    try:
        for node in range(3):
            port = free_port()
            brokers.append(
                start_broker(
                    tmp / f"node-{node}",
                    store_url=f"file://{tmp / 'store'}",
                    meta_url=etcd_url,
                    node_id=node,
                    extra_args=("--meta-prefix", prefix, "--http", f"127.0.0.1:{port}"),
                )
            )
            urls.append(f"http://127.0.0.1:{port}/registry")
        yield urls
    finally:
        for b in brokers:
            b.stop()


def _schema(name: str) -> dict[str, str]:
    return {"schema": json.dumps({"type": "record", "name": name, "fields": []})}


def test_registered_on_one_served_by_all(cluster: list[str]) -> None:
    subject = f"orders-{uuid.uuid4().hex[:8]}-value"
    code, body = http("POST", f"{cluster[0]}/subjects/{subject}/versions", _schema("A"))
    assert code == 200
    sid = body["id"]
    for url in cluster:
        assert http("GET", f"{url}/schemas/ids/{sid}")[1] == _schema("A")
        got = http("GET", f"{url}/subjects/{subject}/versions/latest")[1]
        assert (got["id"], got["version"]) == (sid, 1)
    # a config set through broker 2 applies to a registration through broker 1
    assert http("PUT", f"{cluster[2]}/config/{subject}", {"compatibility": "FULL"})[0] == 200
    evolved = {"type": "record", "name": "A", "fields": [{"name": "x", "type": "int"}]}
    code, body = http(
        "POST", f"{cluster[1]}/subjects/{subject}/versions", {"schema": json.dumps(evolved)}
    )
    assert (code, body["error_code"]) == (409, 409)


def test_concurrent_registrations_get_unique_ids(cluster: list[str]) -> None:
    run = uuid.uuid4().hex[:8]
    jobs = [(cluster[i % 3], f"s{i % 4}-{run}", f"R{i}") for i in range(24)]

    def register(job: tuple[str, str, str]) -> tuple[str, int]:
        url, subject, name = job
        # NONE: every record name is a new, accepted version
        http("PUT", f"{url}/config/{subject}", {"compatibility": "NONE"})
        code, body = http("POST", f"{url}/subjects/{subject}/versions", _schema(name))
        assert code == 200, body
        return name, int(body["id"])

    with ThreadPoolExecutor(6) as pool:
        ids = dict(pool.map(register, jobs))
    assert len(set(ids.values())) == len(jobs)  # 24 distinct schemas, 24 distinct ids
    for i in range(4):  # every subject holds its 6 versions, seen alike from every broker
        subject = f"s{i}-{run}"
        views = [http("GET", f"{url}/subjects/{subject}/versions")[1] for url in cluster]
        assert views == [[1, 2, 3, 4, 5, 6]] * 3
    # the same schema registered concurrently through all brokers gets one id
    shared = f"shared-{run}"

    def same(url: str) -> int:
        return int(http("POST", f"{url}/subjects/{shared}/versions", _schema(f"S{run}"))[1]["id"])

    with ThreadPoolExecutor(3) as pool:
        assert len(set(pool.map(same, cluster * 2))) == 1
    assert http("GET", f"{cluster[0]}/subjects/{shared}/versions")[1] == [1]


def test_ids_never_reused_after_delete(cluster: list[str]) -> None:
    subject = f"gone-{uuid.uuid4().hex[:8]}"
    sid = http("POST", f"{cluster[0]}/subjects/{subject}/versions", _schema("G1"))[1]["id"]
    assert http("DELETE", f"{cluster[1]}/subjects/{subject}")[0] == 200
    assert http("DELETE", f"{cluster[2]}/subjects/{subject}?permanent=true")[0] == 200
    new = http("POST", f"{cluster[0]}/subjects/{subject}/versions", _schema("G2"))[1]["id"]
    assert new > sid
    # the deleted schema's id still resolves (data written with it stays readable)
    assert http("GET", f"{cluster[1]}/schemas/ids/{sid}")[1] == _schema("G1")
