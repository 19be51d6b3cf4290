"""ACL bindings, filters and the authorizer, with Kafka's semantics
(docs/operations.md, "Security").

A binding is (resource type, pattern type, resource name, principal, host, operation,
permission). The authorizer allows an operation on a resource when:

1. the principal is a super user; or
2. no binding at all matches the resource (literal name, the ``*`` wildcard, or a
   prefix of the name) and ``allow.everyone.if.no.acl.found`` is on; or
3. no matching DENY binding names the principal (or ``User:*``), the host (or ``*``)
   and the operation (or ALL), and a matching ALLOW binding does, where ALLOW of READ,
   WRITE, DELETE or ALTER implies DESCRIBE and ALLOW of ALTER_CONFIGS implies
   DESCRIBE_CONFIGS.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum


class ResourceType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class Permission(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


CLUSTER_NAME = "kafka-cluster"
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"

#: operations valid per resource type (Kafka's AclEntry.supportedOperations)
VALID_OPS: dict[ResourceType, frozenset[Operation]] = {
    ResourceType.TOPIC: frozenset(
        {Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DESCRIBE,
         Operation.DELETE, Operation.ALTER, Operation.DESCRIBE_CONFIGS,
         Operation.ALTER_CONFIGS, Operation.ALL}
    ),
    ResourceType.GROUP: frozenset(
        {Operation.READ, Operation.DESCRIBE, Operation.DELETE, Operation.ALL}
    ),
    ResourceType.CLUSTER: frozenset(
        {Operation.CREATE, Operation.CLUSTER_ACTION, Operation.DESCRIBE_CONFIGS,
         Operation.ALTER_CONFIGS, Operation.IDEMPOTENT_WRITE, Operation.ALTER,
         Operation.DESCRIBE, Operation.ALL}
    ),
    ResourceType.TRANSACTIONAL_ID: frozenset(
        {Operation.DESCRIBE, Operation.WRITE, Operation.ALL}
    ),
    ResourceType.DELEGATION_TOKEN: frozenset({Operation.DESCRIBE, Operation.ALL}),
    ResourceType.USER: frozenset(
        {Operation.CREATE_TOKENS, Operation.DESCRIBE_TOKENS, Operation.ALL}
    ),
}  # fmt: skip

_IMPLIES = {
    Operation.DESCRIBE: (
        Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER
    ),
    Operation.DESCRIBE_CONFIGS: (Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS),
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class AclBinding:
    resource_type: ResourceType
    pattern_type: PatternType
    name: str
    principal: str
    host: str
    operation: Operation
    permission: Permission

    def to_json(self) -> bytes:
        return json.dumps(
            [int(self.resource_type), int(self.pattern_type), self.name, self.principal,
             self.host, int(self.operation), int(self.permission)],
            separators=(",", ":"),
        ).encode()  # fmt: skip

    @classmethod
    def from_json(cls, value: bytes) -> AclBinding:
        rt, pt, name, principal, host, op, perm = json.loads(value)
        return cls(
            ResourceType(rt), PatternType(pt), str(name), str(principal), str(host),
            Operation(op), Permission(perm),
        )  # fmt: skip

    def invalid(self) -> str | None:
        """Why this binding cannot be created (None: it can)."""
        if self.resource_type not in VALID_OPS:
            return "invalid resource type"
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            return "pattern type must be LITERAL or PREFIXED"
        if self.permission not in (Permission.ALLOW, Permission.DENY):
            return "permission must be ALLOW or DENY"
        if self.operation not in VALID_OPS[self.resource_type]:
            return f"operation {self.operation.name} is invalid for {self.resource_type.name}"
        if not self.name:
            return "resource name must not be empty"
        if self.resource_type == ResourceType.CLUSTER and self.name != CLUSTER_NAME:
            return f"the cluster resource is named {CLUSTER_NAME}"
        kind, sep, _ = self.principal.partition(":")
        if not sep or not kind or not self.principal[len(kind) + 1 :]:
            return "principal must be TYPE:NAME"
        if self.pattern_type == PatternType.PREFIXED and self.name == WILDCARD:
            return "a prefixed pattern cannot be the wildcard"
        return None


@dataclass(frozen=True, slots=True)
class AclFilter:
    """A filter of DescribeAcls / DeleteAcls (None fields match anything)."""

    resource_type: ResourceType
    pattern_type: PatternType
    name: str | None
    principal: str | None
    host: str | None
    operation: Operation
    permission: Permission

    def invalid(self) -> str | None:
        if self.resource_type == ResourceType.UNKNOWN or self.operation == Operation.UNKNOWN:
            return "unknown resource type or operation"
        if self.pattern_type == PatternType.UNKNOWN or self.permission == Permission.UNKNOWN:
            return "unknown pattern type or permission"
        return None

    def matches(self, b: AclBinding) -> bool:
        if self.resource_type != ResourceType.ANY and b.resource_type != self.resource_type:
            return False
        if not self._pattern_matches(b):
            return False
        if self.principal is not None and b.principal != self.principal:
            return False
        if self.host is not None and b.host != self.host:
            return False
        if self.operation != Operation.ANY and b.operation != self.operation:
            return False
        return self.permission == Permission.ANY or b.permission == self.permission

    def _pattern_matches(self, b: AclBinding) -> bool:
        pt, name = self.pattern_type, self.name
        if pt == PatternType.MATCH:  # bindings that would apply to the named resource
            if name is None:
                return True
            if b.pattern_type == PatternType.LITERAL:
                return b.name in (name, WILDCARD)
            return b.pattern_type == PatternType.PREFIXED and name.startswith(b.name)
        if pt != PatternType.ANY and b.pattern_type != pt:
            return False
        return name is None or b.name == name


class Authorizer:
    """Decisions over the current bindings (replaced as a whole on every change)."""

    def __init__(self, super_users: Iterable[str] = (), allow_if_no_acl: bool = False) -> None:
        self.super_users = frozenset(super_users)
        self.allow_if_no_acl = allow_if_no_acl
        self._literal: dict[tuple[ResourceType, str], list[AclBinding]] = {}
        self._prefixed: dict[ResourceType, list[AclBinding]] = {}

    def load(self, bindings: Iterable[AclBinding]) -> None:
        literal: dict[tuple[ResourceType, str], list[AclBinding]] = {}
        prefixed: dict[ResourceType, list[AclBinding]] = {}
        for b in bindings:
            if b.pattern_type == PatternType.PREFIXED:
                prefixed.setdefault(b.resource_type, []).append(b)
            else:
                literal.setdefault((b.resource_type, b.name), []).append(b)
        self._literal, self._prefixed = literal, prefixed

    def matching(self, rtype: ResourceType, name: str) -> list[AclBinding]:
        out = list(self._literal.get((rtype, name), ()))
        out += self._literal.get((rtype, WILDCARD), ())
        out += [b for b in self._prefixed.get(rtype, ()) if name.startswith(b.name)]
        return out

    def authorize(
        self, principal: str, host: str, op: Operation, rtype: ResourceType, name: str
    ) -> bool:
        if principal in self.super_users:
            return True
        acls = self.matching(rtype, name)
        if not acls:
            return self.allow_if_no_acl
        principals = (principal, WILDCARD_PRINCIPAL)
        hosts = (host, WILDCARD)
        for b in acls:
            if (
                b.permission == Permission.DENY
                and b.principal in principals
                and b.host in hosts
                and b.operation in (op, Operation.ALL)
            ):
                return False
        allowed_ops = _IMPLIES.get(op, (op,))
        for b in acls:
            if (
                b.permission == Permission.ALLOW
                and b.principal in principals
                and b.host in hosts
                and (b.operation == Operation.ALL or b.operation in allowed_ops)
            ):
                return True
        return False

    def authorize_any(self, principal: str, host: str, op: Operation, rtype: ResourceType) -> bool:
        """Whether ``op`` is allowed on at least one resource of ``rtype`` (Kafka's
        authorizeByResourceType): an ALLOW binding for the principal that no wildcard
        DENY cancels."""
        if principal in self.super_users:
            return True
        principals, hosts = (principal, WILDCARD_PRINCIPAL), (host, WILDCARD)
        bindings = [b for (rt, _n), bs in self._literal.items() if rt == rtype for b in bs]
        bindings += self._prefixed.get(rtype, [])
        if not bindings:
            return self.allow_if_no_acl
        ops = (op, Operation.ALL)
        for b in bindings:
            if (b.permission == Permission.DENY and b.name == WILDCARD
                    and b.pattern_type == PatternType.LITERAL and b.principal in principals
                    and b.host in hosts and b.operation in ops):  # fmt: skip
                return False
        return any(
            b.permission == Permission.ALLOW and b.principal in principals
            and b.host in hosts and b.operation in ops
            for b in bindings
        )  # fmt: skip
