"""An ACL change made through one broker of a 3-broker cluster (real etcd) is enforced by
the other two (they follow ``/security/acls/`` with a watch), and so is its removal.
The wait is on the behaviour, with a generous deadline; the time is not asserted."""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kafka.protocol.admin import (
    CreateAclsRequest,
    CreateAclsResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
)
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from tests.fixtures.broker import BrokerProcess, free_port, start_broker
from tests.integration.kafka_raw import RawConn
from tests.integration.security.conftest import kafscale
from tests.integration.security.raw_sasl import login

pytestmark = pytest.mark.integration
DEADLINE = 30.0
TOPIC, READ, ALLOW, LITERAL, ANY = 2, 3, 3, 3, 1


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, etcd_url: str
) -> Iterator[list[tuple[BrokerProcess, int]]]:
    tmp: Path = tmp_path_factory.mktemp("acl-cluster")
    prefix = f"/acl-{uuid.uuid4().hex[:8]}"
    for user, pw in (("admin", "admin-pw"), ("reader", "reader-pw")):
        r = kafscale("users", "--meta", etcd_url, "--meta-prefix", prefix, "create", user,
                     "--password", pw)  # fmt: skip
        assert r.returncode == 0, r.stderr
    out: list[tuple[BrokerProcess, int]] = []
    try:
        for node in range(3):
            sasl = free_port()
            b = start_broker(
                tmp / f"b{node}", store_url=f"file://{tmp / 'store'}", meta_url=etcd_url,
                node_id=node,
                extra_args=("--meta-prefix", prefix, "--lease-ttl", "3",
                            "--listener", f"SASL_PLAINTEXT://127.0.0.1:{sasl}",
                            "--authorizer", "true", "--super-users", "User:admin"),
            )  # fmt: skip
            out.append((b, sasl))
        yield out
    finally:
        for b, _ in out:
            b.stop()


def visible(port: int, topic: str) -> bool:
    with RawConn(port) as c:
        login(c, "reader", "reader-pw")
        req = MetadataRequest(topics=[(topic,)], allow_auto_topic_creation=False)
        (t,) = c.call(req, MetadataResponse, 9, 10).topics
        return t.error_code != 29  # TOPIC_AUTHORIZATION_FAILED


def eventually(cond: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_acl_change_on_one_broker_enforced_by_the_others(
    cluster: list[tuple[BrokerProcess, int]],
) -> None:
    topic = f"cl-{uuid.uuid4().hex[:8]}"
    ports = [sasl for _, sasl in cluster]
    assert not any(visible(p, topic) for p in ports)
    binding = (TOPIC, topic, LITERAL, "User:reader", "*", READ, ALLOW)
    with RawConn(ports[0]) as c:
        login(c, "admin", "admin-pw")
        resp = c.call(CreateAclsRequest(creations=[binding]), CreateAclsResponse, 3, 20)
        assert [r.error_code for r in resp.results] == [0]
    for p in ports[1:]:
        assert eventually(functools.partial(visible, p, topic)), f"broker {p} never saw the ACL"
    with RawConn(ports[2]) as c:  # removed through another broker
        login(c, "admin", "admin-pw")
        f = (TOPIC, topic, LITERAL, "User:reader", None, ANY, ANY)
        resp = c.call(DeleteAclsRequest(filters=[f]), DeleteAclsResponse, 3, 21)
        assert len(resp.filter_results[0].matching_acls) == 1
    for p in ports[:2]:
        gone = functools.partial(lambda port: not visible(port, topic), p)
        assert eventually(gone), f"broker on {p} kept the ACL"
