"""``kafscale acls``: ACL bindings through Kafka's admin APIs or, for a stopped cluster,
in its metadata store (docs/operations.md, "Security").

    kafscale acls add|remove (--allow-principal P | --deny-principal P) [--operation OP ...]
                  (--topic T | --group G | --cluster | --transactional-id X)
                  [--resource-pattern-type literal|prefixed] [--host H]
    kafscale acls list [resource options]

The connection flags (``--bootstrap`` with SASL/TLS options, or ``--meta``) are those of
``kafscale users`` (``broker.cli_security``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from broker.cli import EnvParser
from broker.cli_security import (
    EXIT_ERROR,
    EXIT_OK,
    client_admin,
    client_flags,
    connect_target,
    open_client_meta,
)
from broker.security.acl import (
    CLUSTER_NAME,
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)

_OPS = {op.name.replace("_", "").lower(): op for op in Operation if op > Operation.ANY}


def _op(text: str) -> Operation:
    key = text.replace("_", "").replace("-", "").lower()
    if key not in _OPS:
        raise argparse.ArgumentTypeError(f"unknown operation {text!r}")
    return _OPS[key]


def _acls_parser() -> EnvParser:
    pp = EnvParser("kafscale acls", "ACL bindings (add, remove, list).")
    client_flags(pp)
    sub = pp.parser.add_subparsers(dest="command", required=True)
    for name, help_ in (("add", "add bindings"), ("remove", "remove matching bindings"),
                        ("list", "list matching bindings")):  # fmt: skip
        sp = sub.add_parser(name, help=help_)
        sp.add_argument("--allow-principal", action="append", default=[])
        sp.add_argument("--deny-principal", action="append", default=[])
        sp.add_argument("--operation", action="append", type=_op, default=[],
                        help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, "
                        "DescribeConfigs, AlterConfigs, IdempotentWrite, All")  # fmt: skip
        sp.add_argument("--host", default=None, help="client host (default * for add)")
        sp.add_argument("--topic")
        sp.add_argument("--group")
        sp.add_argument("--transactional-id")
        sp.add_argument("--cluster", action="store_true")
        sp.add_argument("--resource-pattern-type", default=None,
                        choices=("literal", "prefixed", "any", "match"))  # fmt: skip
    return pp


def _resource(ns: argparse.Namespace) -> tuple[ResourceType, str | None]:
    if ns.topic is not None:
        return ResourceType.TOPIC, ns.topic
    if ns.group is not None:
        return ResourceType.GROUP, ns.group
    if ns.transactional_id is not None:
        return ResourceType.TRANSACTIONAL_ID, ns.transactional_id
    if ns.cluster:
        return ResourceType.CLUSTER, CLUSTER_NAME
    return ResourceType.ANY, None


def _bindings(pp: EnvParser, ns: argparse.Namespace) -> list[AclBinding]:
    rtype, name = _resource(ns)
    if name is None:
        pp.error("add needs one of --topic, --group, --transactional-id, --cluster")
    if not ns.allow_principal and not ns.deny_principal:
        pp.error("add needs --allow-principal or --deny-principal")
    pattern = PatternType[(ns.resource_pattern_type or "literal").upper()]
    ops = ns.operation or [Operation.ALL]
    out = []
    for perm, principals in ((Permission.ALLOW, ns.allow_principal),
                             (Permission.DENY, ns.deny_principal)):  # fmt: skip
        for p in principals:
            for op in ops:
                out.append(AclBinding(rtype, pattern, name, p, ns.host or "*", op, perm))
    for b in out:
        why = b.invalid()
        if why:
            pp.error(why)
    return out


def _filters(ns: argparse.Namespace) -> list[AclFilter]:
    rtype, name = _resource(ns)
    default = "literal" if ns.command == "remove" and name is not None else "any"
    pattern = PatternType[(ns.resource_pattern_type or default).upper()]
    principals: list[tuple[str | None, Permission]] = [
        (p, Permission.ALLOW) for p in ns.allow_principal
    ] + [(p, Permission.DENY) for p in ns.deny_principal]
    principals = principals or [(None, Permission.ANY)]
    ops = ns.operation or [Operation.ANY]
    return [
        AclFilter(rtype, pattern, name, p, ns.host, op, perm)
        for p, perm in principals
        for op in ops
    ]


def _line(b: AclBinding) -> str:
    return (
        f"{b.resource_type.name} {b.pattern_type.name} {b.name} {b.principal} "
        f"{b.host} {b.operation.name} {b.permission.name}"
    )


def main(argv: Sequence[str], out: TextIO | None = None) -> int:
    out = out or sys.stdout
    pp = _acls_parser()
    ns = pp.parse_args(argv)
    target = connect_target(pp, ns)
    bindings = _bindings(pp, ns) if ns.command == "add" else []
    filters = _filters(ns) if ns.command != "add" else []
    try:
        if target == "admin":
            found = _acls_admin(ns, bindings, filters)
        else:
            found = asyncio.run(_acls_meta(ns, bindings, filters))
    except Exception as exc:  # noqa: BLE001 - one line for the operator
        print(f"kafscale acls: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    verb = {"add": "added", "remove": "removed", "list": ""}[ns.command]
    for b in found:
        out.write(f"{verb + ' ' if verb else ''}{_line(b)}\n")
    return EXIT_OK


def _acls_admin(
    ns: argparse.Namespace, bindings: list[AclBinding], filters: list[AclFilter]
) -> list[AclBinding]:
    from kafka.admin import (
        ACL,
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        ResourcePattern,
        ResourcePatternFilter,
    )
    from kafka.admin import ResourceType as KRT

    admin = client_admin(ns)

    def back(a: Any) -> AclBinding:
        rp = a.resource_pattern
        return AclBinding(
            ResourceType(int(rp.resource_type)), PatternType(int(rp.pattern_type)),
            rp.resource_name, a.principal, a.host, Operation(int(a.operation)),
            Permission(int(a.permission_type)),
        )  # fmt: skip

    try:
        if ns.command == "add":
            acls = [
                ACL(b.principal, b.host, ACLOperation(int(b.operation)),
                    ACLPermissionType(int(b.permission)),
                    ResourcePattern(KRT(int(b.resource_type)), b.name,
                                    ACLResourcePatternType(int(b.pattern_type))))
                for b in bindings
            ]  # fmt: skip
            res = admin.create_acls(acls)
            if res["failed"]:
                raise RuntimeError("; ".join(f"{a}: {e}" for a, e in res["failed"]))
            return bindings
        kfilters = [
            ACLFilter(f.principal, f.host, ACLOperation(int(f.operation)),
                      ACLPermissionType(int(f.permission)),
                      ResourcePatternFilter(KRT(int(f.resource_type)), f.name,
                                            ACLResourcePatternType(int(f.pattern_type))))
            for f in filters
        ]  # fmt: skip
        found: list[AclBinding] = []
        if ns.command == "list":
            for kf in kfilters:
                acls, err = admin.describe_acls(kf)
                found += [back(a) for a in acls]
        else:
            for _kf, matched, err in admin.delete_acls(kfilters):
                if err is not None:
                    raise RuntimeError(str(err))
                found += [back(a) for a, _e in matched]
        return list(dict.fromkeys(found))
    finally:
        admin.close()


async def _acls_meta(
    ns: argparse.Namespace, bindings: list[AclBinding], filters: list[AclFilter]
) -> list[AclBinding]:
    from broker.security.store import AclStore

    meta = open_client_meta(ns)
    try:
        store = AclStore(meta, lambda _b: None)
        if ns.command == "add":
            await store.create(bindings)
            return bindings
        if ns.command == "remove":
            return [b for per in await store.delete(filters) for b in per]
        await store._sync()
        return list(dict.fromkeys(b for f in filters for b in store.describe(f)))
    finally:
        await meta.close()
