"""The ACL matrix against a live broker (``--authorizer true``, ``User:admin`` super):
for each operation an allowed principal succeeds and a denied one gets Kafka's error
code; prefixed patterns, DENY over ALLOW, super users; topics a principal may not
DESCRIBE are absent from its Metadata; the ACL APIs themselves and ``kafscale acls``."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from protocol.records import build_batch
from tests.integration.kafka_raw import RawConn
from tests.integration.security.conftest import PASSWORDS, SecureBroker, admin_flags, kafscale
from tests.integration.security.raw_sasl import login

pytestmark = pytest.mark.integration
TIMEOUT = 30.0
LIT, PRE = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
ANY_STR: Any = None  # a filter's "any principal / host" (the stubs say str)


def uid() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def admin(secure_broker: SecureBroker) -> AdminClient:
    return AdminClient(secure_broker.confluent("SASL_PLAINTEXT", "admin"))


def acl(rtype: ResourceType, name: str, who: str, op: AclOperation, perm=ALLOW, pt=LIT) -> Any:
    return AclBinding(rtype, name, pt, who, "*", op, perm)


def add_acls(admin: AdminClient, *bindings: Any) -> None:
    for fut in admin.create_acls(list(bindings), request_timeout=TIMEOUT).values():
        fut.result(TIMEOUT)


def create_topics(admin: AdminClient, *names: str, partitions: int = 1) -> None:
    futs = admin.create_topics([NewTopic(n, partitions, 1) for n in names])
    for fut in futs.values():
        fut.result(TIMEOUT)


def produce_error(sb: SecureBroker, user: str, topic: str) -> int | None:
    """The delivery error code of one record produced as ``user`` (None: delivered)."""
    p = Producer({**sb.confluent("SASL_PLAINTEXT", user), "message.timeout.ms": 15000})
    out: list[KafkaError | None] = []
    p.produce(topic, b"x", on_delivery=lambda e, m: out.append(e))
    p.flush(TIMEOUT)
    assert out, "no delivery report"
    return None if out[0] is None else out[0].code()


def consume_error(sb: SecureBroker, user: str, topic: str, group: str) -> int | None:
    """The first error consuming ``topic`` in ``group`` as ``user`` (None: a record came)."""
    c = Consumer(sb.confluent("SASL_PLAINTEXT", user, **{
        "group.id": group, "auto.offset.reset": "earliest"}))  # fmt: skip
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            err = m.error()
            if err is None:
                return None
            if err.code() != KafkaError._PARTITION_EOF:
                return int(err.code())
        raise AssertionError("neither a record nor an error")
    finally:
        c.close()


def test_write_allowed_and_denied(secure_broker: SecureBroker, admin: AdminClient) -> None:
    t = f"w-{uid()}"
    create_topics(admin, t)
    add_acls(admin, acl(ResourceType.TOPIC, t, "User:alice", AclOperation.WRITE))
    assert produce_error(secure_broker, "alice", t) is None
    assert produce_error(secure_broker, "bob", t) == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_read_needs_topic_and_group(secure_broker: SecureBroker, admin: AdminClient) -> None:
    t, g, g2 = f"r-{uid()}", f"g-{uid()}", f"g2-{uid()}"
    create_topics(admin, t)
    p = Producer(secure_broker.confluent("SASL_PLAINTEXT", "admin"))
    p.produce(t, b"rec")
    assert p.flush(TIMEOUT) == 0
    add_acls(
        admin,
        acl(ResourceType.TOPIC, t, "User:alice", AclOperation.READ),
        acl(ResourceType.GROUP, g, "User:alice", AclOperation.READ),
        acl(ResourceType.TOPIC, t, "User:bob", AclOperation.READ),
        acl(ResourceType.GROUP, g2, "User:bob", AclOperation.READ),
    )
    assert consume_error(secure_broker, "alice", t, g) is None
    assert consume_error(secure_broker, "bob", t, g) == KafkaError.GROUP_AUTHORIZATION_FAILED
    assert consume_error(secure_broker, "bob", t, g2) is None
    add_acls(admin, acl(ResourceType.TOPIC, t, "User:bob", AclOperation.READ, DENY))
    assert consume_error(secure_broker, "bob", t, g2) == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_prefixed_and_deny_over_allow(secure_broker: SecureBroker, admin: AdminClient) -> None:
    base = f"pre-{uid()}"
    create_topics(admin, f"{base}-a", f"{base}-b", f"{base[:-1]}X-c")
    add_acls(
        admin,
        acl(ResourceType.TOPIC, f"{base}-", "User:*", AclOperation.WRITE, pt=PRE),
        acl(ResourceType.TOPIC, f"{base}-b", "User:bob", AclOperation.WRITE, DENY),
    )
    assert produce_error(secure_broker, "alice", f"{base}-a") is None
    assert produce_error(secure_broker, "bob", f"{base}-a") is None
    assert produce_error(secure_broker, "alice", f"{base}-b") is None
    assert produce_error(secure_broker, "bob", f"{base}-b") == 29
    assert produce_error(secure_broker, "alice", f"{base[:-1]}X-c") == 29


def test_super_user_needs_no_acl(secure_broker: SecureBroker, admin: AdminClient) -> None:
    t = f"su-{uid()}"
    create_topics(admin, t)
    assert produce_error(secure_broker, "admin", t) is None
    assert produce_error(secure_broker, "alice", t) == KafkaError.TOPIC_AUTHORIZATION_FAILED


def raw(sb: SecureBroker, user: str) -> RawConn:
    conn = RawConn(sb.ports["SASL_PLAINTEXT"])
    login(conn, user, PASSWORDS[user])
    return conn


def test_metadata_hides_topics_without_describe(
    secure_broker: SecureBroker, admin: AdminClient
) -> None:
    seen, hidden = f"seen-{uid()}", f"hidden-{uid()}"
    create_topics(admin, seen, hidden)
    add_acls(admin, acl(ResourceType.TOPIC, seen, "User:alice", AclOperation.READ))  # implies
    with raw(secure_broker, "alice") as c:
        req = MetadataRequest(topics=None, allow_auto_topic_creation=False)
        names = {t.name for t in c.call(req, MetadataResponse, 9, 10).topics}
        assert seen in names and hidden not in names
        req = MetadataRequest(topics=[(hidden,)], allow_auto_topic_creation=False)
        (t,) = c.call(req, MetadataResponse, 9, 11).topics
        assert t.error_code == KafkaError.TOPIC_AUTHORIZATION_FAILED and not t.partitions


def test_produce_errors_per_partition(secure_broker: SecureBroker, admin: AdminClient) -> None:
    ok, denied = f"pp-ok-{uid()}", f"pp-no-{uid()}"
    create_topics(admin, ok, denied, partitions=2)
    add_acls(admin, acl(ResourceType.TOPIC, ok, "User:alice", AclOperation.WRITE))
    batch = build_batch([(None, b"v", [])], base_timestamp=int(time.time() * 1000))
    data = [(t, [(p, batch) for p in (0, 1)]) for t in (ok, denied)]
    req = ProduceRequest(transactional_id=None, acks=-1, timeout_ms=10000, topic_data=data)
    with raw(secure_broker, "alice") as c:
        resp = c.call(req, ProduceResponse, 8, 20)
    codes = {(t.name, p.index): p.error_code for t in resp.responses for p in t.partition_responses}
    assert codes == {(ok, 0): 0, (ok, 1): 0, (denied, 0): 29, (denied, 1): 29}


def test_admin_operations(secure_broker: SecureBroker, admin: AdminClient) -> None:
    mine, other = f"adm-{uid()}", f"adm-other-{uid()}"
    alice = AdminClient(secure_broker.confluent("SASL_PLAINTEXT", "alice"))
    add_acls(admin, acl(ResourceType.TOPIC, mine, "User:alice", AclOperation.CREATE),
             acl(ResourceType.TOPIC, mine, "User:alice", AclOperation.DELETE))  # fmt: skip
    create_topics(alice, mine)
    with pytest.raises(Exception) as exc:
        create_topics(alice, other)
    assert exc.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    create_topics(admin, other)
    (fut,) = alice.delete_topics([other], request_timeout=TIMEOUT).values()
    with pytest.raises(Exception) as exc:
        fut.result(TIMEOUT)
    assert exc.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    (fut,) = alice.delete_topics([mine], request_timeout=TIMEOUT).values()
    fut.result(TIMEOUT)
    # the ACL APIs need the cluster's ALTER/DESCRIBE
    (fut,) = alice.create_acls([acl(ResourceType.TOPIC, "x", "User:alice", AclOperation.ALL)],
                               request_timeout=TIMEOUT).values()  # fmt: skip
    with pytest.raises(Exception) as exc:
        fut.result(TIMEOUT)
    assert exc.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED


def test_describe_and_delete_acls(secure_broker: SecureBroker, admin: AdminClient) -> None:
    name = f"dd-{uid()}"
    bindings = [acl(ResourceType.TOPIC, name, "User:alice", AclOperation.READ),
                acl(ResourceType.TOPIC, name, "User:bob", AclOperation.WRITE, DENY),
                acl(ResourceType.GROUP, name, "User:alice", AclOperation.READ)]  # fmt: skip
    add_acls(admin, *bindings)
    f = AclBindingFilter(ResourceType.ANY, name, ResourcePatternType.MATCH, ANY_STR, ANY_STR,
                         AclOperation.ANY, AclPermissionType.ANY)  # fmt: skip
    found = admin.describe_acls(f, request_timeout=TIMEOUT).result(TIMEOUT)
    assert sorted(map(str, found)) == sorted(map(str, bindings))
    # the CLI lists them too (admin API)
    r = kafscale("acls", *admin_flags(secure_broker), "list", "--topic", name)
    assert r.returncode == 0, r.stderr
    assert sorted(line.split()[3] for line in r.stdout.splitlines()) == ["User:alice", "User:bob"]
    only_topic = AclBindingFilter(ResourceType.TOPIC, name, LIT, ANY_STR, ANY_STR,
                                  AclOperation.ANY, AclPermissionType.ANY)  # fmt: skip
    (fut,) = admin.delete_acls([only_topic], request_timeout=TIMEOUT).values()
    assert len(fut.result(TIMEOUT)) == 2
    left = admin.describe_acls(f, request_timeout=TIMEOUT).result(TIMEOUT)
    assert [b.restype for b in left] == [ResourceType.GROUP]


def wait_for(cond: Callable[[], bool], timeout: float = TIMEOUT) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return False


def test_scram_user_admin_api_and_cli(secure_broker: SecureBroker, admin: AdminClient) -> None:
    from confluent_kafka.admin import (
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialDeletion,
        UserScramCredentialUpsertion,
    )

    user = f"u{uid()}"
    up = UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), b"pw-1", b"salt-of-the-earth"
    )
    for fut in admin.alter_user_scram_credentials([up], request_timeout=TIMEOUT).values():
        fut.result(TIMEOUT)
    conn = RawConn(secure_broker.ports["SASL_PLAINTEXT"])
    with conn:
        login(conn, user, "pw-1", "SCRAM-SHA-512")
    # the CLI over the admin API: list shows the user, delete removes it
    r = kafscale("users", *admin_flags(secure_broker), "list")
    assert r.returncode == 0 and f"{user} SCRAM-SHA-512:8192" in r.stdout, r.stdout + r.stderr
    r = kafscale("users", *admin_flags(secure_broker), "delete", user)
    assert r.returncode == 0, r.stderr
    r = kafscale("users", *admin_flags(secure_broker), "list")
    assert user not in r.stdout
    dele = UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_512)
    (fut,) = admin.alter_user_scram_credentials([dele], request_timeout=TIMEOUT).values()
    with pytest.raises(Exception) as exc:
        fut.result(TIMEOUT)
    assert exc.value.args[0].code() == KafkaError.RESOURCE_NOT_FOUND


def test_metadata_and_describe_cluster_advertise_the_clients_listener(
    secure_broker: SecureBroker,
) -> None:
    from kafka.protocol.admin import DescribeClusterRequest, DescribeClusterResponse

    with raw(secure_broker, "admin") as c:
        md = c.call(MetadataRequest(topics=[]), MetadataResponse, 9, 30)
        assert [(b.host, b.port) for b in md.brokers] == [
            ("127.0.0.1", secure_broker.ports["SASL_PLAINTEXT"])
        ]
        dc = c.call(DescribeClusterRequest(), DescribeClusterResponse, 0, 31)
        assert [b.port for b in dc.brokers] == [secure_broker.ports["SASL_PLAINTEXT"]]
    with RawConn(secure_broker.ports["PLAINTEXT"]) as c:  # anonymous, plaintext listener
        md = c.call(MetadataRequest(topics=[]), MetadataResponse, 9, 32)
        assert [b.port for b in md.brokers] == [secure_broker.ports["PLAINTEXT"]]
        dc = c.call(DescribeClusterRequest(), DescribeClusterResponse, 0, 33)
        assert dc.error_code == KafkaError.CLUSTER_AUTHORIZATION_FAILED


def test_authorized_operations_kip430(secure_broker: SecureBroker, admin: AdminClient) -> None:
    from confluent_kafka import TopicCollection

    t = f"ops-{uid()}"
    create_topics(admin, t)
    add_acls(admin, acl(ResourceType.TOPIC, t, "User:alice", AclOperation.READ),
             acl(ResourceType.TOPIC, t, "User:alice", AclOperation.ALTER_CONFIGS))  # fmt: skip
    alice = AdminClient(secure_broker.confluent("SASL_PLAINTEXT", "alice"))
    (fut,) = alice.describe_topics(
        TopicCollection([t]), include_authorized_operations=True, request_timeout=TIMEOUT
    ).values()
    ops = set(fut.result(TIMEOUT).authorized_operations)
    assert ops == {AclOperation.READ, AclOperation.DESCRIBE, AclOperation.ALTER_CONFIGS,
                   AclOperation.DESCRIBE_CONFIGS}  # fmt: skip
    desc = admin.describe_cluster(include_authorized_operations=True, request_timeout=TIMEOUT)
    assert AclOperation.ALTER in set(desc.result(TIMEOUT).authorized_operations)  # super user
