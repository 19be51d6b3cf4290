"""The authorizer's semantics (Kafka's): literal, wildcard and prefixed patterns, DENY
over ALLOW, implied operations, super users, allow-if-no-ACL, filters."""

from __future__ import annotations

import pytest

from broker.security.acl import (
    AclBinding,
    AclFilter,
    Authorizer,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)

T, G, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY
Op = Operation


def b(rt: ResourceType, pt: PatternType, name: str, who: str, op: Operation,
      perm: Permission = ALLOW, host: str = "*") -> AclBinding:  # fmt: skip
    return AclBinding(rt, pt, name, who, host, op, perm)


def authz(*bindings: AclBinding, supers: tuple[str, ...] = (), allow_if_none: bool = False):
    a = Authorizer(supers, allow_if_none)
    a.load(bindings)
    return lambda who, op, rt, name, host="10.0.0.1": a.authorize(who, host, op, rt, name)


def test_literal_allow_and_default_deny() -> None:
    can = authz(b(T, LIT, "orders", "User:alice", Op.WRITE))
    assert can("User:alice", Op.WRITE, T, "orders")
    assert not can("User:bob", Op.WRITE, T, "orders")
    assert not can("User:alice", Op.READ, T, "orders")
    assert not can("User:alice", Op.WRITE, T, "orders2")  # literal: exact name only
    assert not can("User:alice", Op.WRITE, T, "other")  # no ACL at all: denied by default


def test_allow_everyone_if_no_acl_found_only_for_resources_without_acls() -> None:
    can = authz(b(T, LIT, "orders", "User:alice", Op.WRITE), allow_if_none=True)
    assert can("User:bob", Op.WRITE, T, "free-for-all")
    assert not can("User:bob", Op.WRITE, T, "orders")


def test_prefixed_and_wildcard() -> None:
    can = authz(
        b(T, PRE, "logs-", "User:alice", Op.READ),
        b(T, LIT, "*", "User:*", Op.DESCRIBE),
        b(G, PRE, "", "User:carol", Op.READ),
    )
    assert can("User:alice", Op.READ, T, "logs-app")
    assert not can("User:alice", Op.READ, T, "log-app")
    assert can("User:bob", Op.DESCRIBE, T, "anything")
    assert not can("User:bob", Op.READ, T, "anything")


def test_deny_wins_over_allow() -> None:
    can = authz(
        b(T, PRE, "pay", "User:*", Op.ALL),
        b(T, LIT, "payroll", "User:eve", Op.READ, DENY),
        b(T, LIT, "payments", "User:*", Op.WRITE, DENY, host="10.0.0.9"),
    )
    assert can("User:eve", Op.READ, T, "payments")
    assert not can("User:eve", Op.READ, T, "payroll")
    assert can("User:eve", Op.WRITE, T, "payroll")  # DENY READ does not deny WRITE
    assert not can("User:bob", Op.WRITE, T, "payments", host="10.0.0.9")
    assert can("User:bob", Op.WRITE, T, "payments", host="10.0.0.8")


def test_deny_all_denies_every_operation() -> None:
    can = authz(b(T, LIT, "t", "User:a", Op.ALL), b(T, LIT, "t", "User:a", Op.ALL, DENY))
    for op in (Op.READ, Op.WRITE, Op.DESCRIBE, Op.DELETE):
        assert not can("User:a", op, T, "t")


@pytest.mark.parametrize("granted", [Op.READ, Op.WRITE, Op.DELETE, Op.ALTER])
def test_describe_implied(granted: Operation) -> None:
    can = authz(b(T, LIT, "t", "User:a", granted))
    assert can("User:a", Op.DESCRIBE, T, "t")


def test_describe_configs_implied_by_alter_configs_but_not_back() -> None:
    can = authz(b(T, LIT, "t", "User:a", Op.ALTER_CONFIGS))
    assert can("User:a", Op.DESCRIBE_CONFIGS, T, "t")
    can2 = authz(b(T, LIT, "t", "User:a", Op.DESCRIBE_CONFIGS))
    assert not can2("User:a", Op.ALTER_CONFIGS, T, "t")


def test_deny_describe_is_not_implied_by_deny_read() -> None:
    can = authz(b(T, LIT, "t", "User:a", Op.WRITE), b(T, LIT, "t", "User:a", Op.READ, DENY))
    assert can("User:a", Op.DESCRIBE, T, "t")


def test_super_users() -> None:
    can = authz(b(T, LIT, "t", "User:root", Op.ALL, DENY), supers=("User:root",))
    assert can("User:root", Op.WRITE, T, "t")
    assert can("User:root", Op.ALTER, C, "kafka-cluster")


def test_authorize_any() -> None:
    a = Authorizer()
    a.load([b(T, PRE, "x", "User:a", Op.WRITE)])
    assert a.authorize_any("User:a", "h", Op.WRITE, T)
    assert not a.authorize_any("User:b", "h", Op.WRITE, T)
    a.load([b(T, PRE, "x", "User:a", Op.WRITE), b(T, LIT, "*", "User:a", Op.WRITE, DENY)])
    assert not a.authorize_any("User:a", "h", Op.WRITE, T)


def test_binding_validation() -> None:
    assert b(T, LIT, "t", "User:a", Op.READ).invalid() is None
    assert b(G, LIT, "g", "User:a", Op.WRITE).invalid()  # WRITE is not a group operation
    assert b(C, LIT, "other", "User:a", Op.ALTER).invalid()
    assert b(T, LIT, "t", "alice", Op.READ).invalid()
    assert b(T, PatternType.MATCH, "t", "User:a", Op.READ).invalid()
    assert b(T, PRE, "*", "User:a", Op.READ).invalid()


def test_filters() -> None:
    lit = b(T, LIT, "orders", "User:a", Op.READ)
    pre = b(T, PRE, "ord", "User:b", Op.WRITE, DENY)
    star = b(T, LIT, "*", "User:c", Op.READ)
    grp = b(G, LIT, "orders", "User:a", Op.READ)
    every = AclFilter(ResourceType.ANY, PatternType.ANY, None, None, None, Op.ANY, Permission.ANY)
    assert all(every.matches(x) for x in (lit, pre, star, grp))
    match = AclFilter(T, PatternType.MATCH, "orders", None, None, Op.ANY, Permission.ANY)
    assert [x for x in (lit, pre, star, grp) if match.matches(x)] == [lit, pre, star]
    exact = AclFilter(T, LIT, "orders", "User:a", None, Op.READ, ALLOW)
    assert [x for x in (lit, pre, star, grp) if exact.matches(x)] == [lit]
    assert AclBinding.from_json(pre.to_json()) == pre
