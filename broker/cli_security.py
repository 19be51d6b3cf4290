"""Security flags of ``kafscale broker`` and the ``kafscale users`` / ``kafscale acls``
commands (docs/operations.md, "Security").

    kafscale users create NAME [--password P] [--mechanism M ...] [--iterations N]
    kafscale users delete NAME [--mechanism M ...]
    kafscale users list
    kafscale acls add|remove (--allow-principal P | --deny-principal P) [--operation OP ...]
                  (--topic T | --group G | --cluster | --transactional-id X)
                  [--resource-pattern-type literal|prefixed] [--host H]
    kafscale acls list [resource options]

Against a running cluster (``--bootstrap``, with ``--security-protocol``,
``--sasl-mechanism``, ``--sasl-username``, ``--sasl-password``, ``--ssl-ca``) they go
through Kafka's admin APIs; with ``--meta URL`` (``embedded`` + ``--data-dir``, or
``etcd://``) they write the metadata store of a stopped cluster directly.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import sys
import warnings
from collections.abc import Sequence
from typing import Any, TextIO

from broker.cli import EnvParser, bool_arg
from broker.security.acl import (
    CLUSTER_NAME,
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from broker.security.config import (
    DEFAULT_MECHANISMS,
    MECHANISMS,
    Listener,
    SecurityConfig,
    build_listeners,
    parse_protocol_map,
)
from broker.security.scram import DEFAULT_ITERATIONS, HASHES, MECHANISM_IDS, make_credential

EXIT_OK, EXIT_ERROR = 0, 1

# ------------------------------------------------------------------ kafscale broker flags

SECURITY_FLAGS: list[tuple[str, str]] = [
    ("listener-security-protocol-map", "NAME:PROTOCOL,... for listener names not a protocol"),
    ("ssl-cert", "PEM certificate (chain) of the SSL/SASL_SSL listeners"),
    ("ssl-key", "PEM private key of --ssl-cert"),
    ("ssl-key-password", "password of an encrypted --ssl-key"),
    ("ssl-ca", "PEM CA bundle that client certificates are verified against"),
    ("ssl-principal-mapping-rules", "RULE:pattern/replacement/[LU],...,DEFAULT (Kafka's)"),
    ("super-users", "principals allowed everything, ';'-separated (User:admin;User:ops)"),
    ("oauth-jwks", "JWKS file or http(s) URL that OAUTHBEARER tokens are verified with"),
    ("oauth-issuer", "required 'iss' of OAUTHBEARER tokens"),
    ("oauth-audience", "required 'aud' of OAUTHBEARER tokens"),
    ("oauth-principal-claim", "claim naming the principal (default sub)"),
    ("s3-ca-bundle", "PEM CA bundle an https S3 endpoint is verified against"),
]

ETCD_FLAGS: list[tuple[str, str]] = [
    ("etcd-ca", "PEM CA bundle etcd's TLS certificate is verified against (enables TLS)"),
    ("etcd-cert", "client certificate for etcd (--client-cert-auth)"),
    ("etcd-key", "key of --etcd-cert"),
    ("etcd-user", "etcd user (auth enabled)"),
    ("etcd-password", "password of --etcd-user"),
]


def add_etcd_flags(pp: EnvParser) -> None:
    for flag, help_ in ETCD_FLAGS:
        pp.option(f"--{flag}", help_)


def etcd_auth_of(args: dict[str, Any]) -> Any:
    """The EtcdAuth of the ``--etcd-*`` flags (None: a plain etcd)."""
    return SecurityConfig(
        etcd_ca=args.get("etcd_ca"), etcd_cert=args.get("etcd_cert"),
        etcd_key=args.get("etcd_key"), etcd_user=args.get("etcd_user"),
        etcd_password=args.get("etcd_password"),
    ).etcd_auth()  # fmt: skip


def add_broker_flags(pp: EnvParser) -> None:
    """The security flags of ``kafscale broker`` (each also ``KAFSCALE_<FLAG>``)."""
    pp.option(
        "--listener",
        "NAME://HOST:PORT to listen on, repeatable (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)",
        append=True,
    )
    for flag, help_ in SECURITY_FLAGS:
        pp.option(f"--{flag}", help_)
    add_etcd_flags(pp)
    pp.option("--ssl-client-auth", "none (default), requested or required",
              choices=("none", "requested", "required"))  # fmt: skip
    pp.option("--sasl-mechanisms", "enabled SASL mechanisms, comma-separated "
              f"(default {','.join(DEFAULT_MECHANISMS)}; also OAUTHBEARER)")  # fmt: skip
    pp.option("--sasl-auth-timeout-ms", "close SASL connections not authenticated by then "
              "(default 10000)", type=int)  # fmt: skip
    pp.option("--max-reauth-ms", "session lifetime before re-authentication, KIP-368 "
              "(default 0: none)", type=int)  # fmt: skip
    pp.option("--authorizer", "enforce ACLs (default false)", type=bool_arg)
    pp.option("--allow-everyone-if-no-acl-found", "allow resources without ACLs "
              "(default false)", type=bool_arg)  # fmt: skip


def security_config(
    args: dict[str, Any], plaintext: tuple[str, int, str, int] | None
) -> SecurityConfig:
    """The SecurityConfig the flags describe. ``plaintext``: (host, port, advertised host,
    advertised port) of ``--listen`` when it is to be the PLAINTEXT listener too."""
    specs = list(args.get("listener") or [])
    advertised = [a for a in args.get("advertised_named") or []]
    listeners: tuple[Listener, ...] = ()
    if specs:
        listeners = build_listeners(
            specs, advertised, parse_protocol_map(args.get("listener_security_protocol_map"))
        )
        if plaintext is not None:
            if any(x.name == "PLAINTEXT" for x in listeners):
                raise ValueError("--listen and --listener PLAINTEXT:// both given")
            host, port, ahost, aport = plaintext
            listeners = (Listener("PLAINTEXT", "PLAINTEXT", host, port, ahost, aport),) + listeners
    elif advertised:
        raise ValueError("NAME:// advertised listeners need --listener")
    mechs = tuple(
        m.strip().upper() for m in (args.get("sasl_mechanisms") or "").split(",") if m.strip()
    )
    for m in mechs:
        if m not in MECHANISMS:
            raise ValueError(f"unknown SASL mechanism {m} (known: {', '.join(MECHANISMS)})")
    supers = tuple(s.strip() for s in (args.get("super_users") or "").split(";") if s.strip())
    values: dict[str, Any] = {
        "listeners": listeners,
        "ssl_cert": args.get("ssl_cert"),
        "ssl_key": args.get("ssl_key"),
        "ssl_key_password": args.get("ssl_key_password"),
        "ssl_ca": args.get("ssl_ca"),
        "ssl_client_auth": args.get("ssl_client_auth") or "none",
        "principal_mapping_rules": args.get("ssl_principal_mapping_rules") or "DEFAULT",
        "sasl_mechanisms": mechs or DEFAULT_MECHANISMS,
        "oauth_jwks": args.get("oauth_jwks"),
        "oauth_issuer": args.get("oauth_issuer"),
        "oauth_audience": args.get("oauth_audience"),
        "oauth_principal_claim": args.get("oauth_principal_claim") or "sub",
        "authorizer": bool(args.get("authorizer")),
        "super_users": supers,
        "allow_everyone_if_no_acl_found": bool(args.get("allow_everyone_if_no_acl_found")),
        "etcd_ca": args.get("etcd_ca"),
        "etcd_cert": args.get("etcd_cert"),
        "etcd_key": args.get("etcd_key"),
        "etcd_user": args.get("etcd_user"),
        "etcd_password": args.get("etcd_password"),
    }
    if args.get("sasl_auth_timeout_ms") is not None:
        values["auth_timeout_ms"] = int(args["sasl_auth_timeout_ms"])
    if args.get("max_reauth_ms") is not None:
        values["max_reauth_ms"] = int(args["max_reauth_ms"])
    if "OAUTHBEARER" in values["sasl_mechanisms"] and not values["oauth_jwks"]:
        raise ValueError("OAUTHBEARER needs --oauth-jwks")
    return SecurityConfig(**values)


# ------------------------------------------------------------------ client connection flags


def _client_flags(pp: EnvParser) -> None:
    pp.option("--bootstrap", "broker HOST:PORT of a running cluster (admin API)")
    pp.option("--meta", "metadata store of a stopped cluster: embedded or etcd://HOST:PORT")
    pp.option("--data-dir", "directory of the embedded metadata store (default ./data)",
              default="./data")  # fmt: skip
    pp.option("--meta-prefix", "key prefix in the metadata store (default /kafscale)",
              default="/kafscale")  # fmt: skip
    pp.option("--security-protocol", "PLAINTEXT (default), SSL, SASL_PLAINTEXT, SASL_SSL",
              default="PLAINTEXT")  # fmt: skip
    pp.option("--sasl-mechanism", "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (with --bootstrap)")
    pp.option("--sasl-username", "SASL user (with --bootstrap)")
    pp.option("--sasl-password", "SASL password (with --bootstrap)")
    pp.option("--ssl-ca", "CA bundle that the broker's certificate is verified against")
    pp.option("--ssl-cert", "client certificate (mTLS)")
    pp.option("--ssl-key", "client key (mTLS)")
    add_etcd_flags(pp)


def _admin(ns: argparse.Namespace) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka import KafkaAdminClient

        kwargs: dict[str, Any] = {
            "bootstrap_servers": ns.bootstrap,
            "client_id": "kafscale-security",
            "security_protocol": ns.security_protocol,
        }
        if ns.sasl_mechanism:
            kwargs.update(
                sasl_mechanism=ns.sasl_mechanism,
                sasl_plain_username=ns.sasl_username,
                sasl_plain_password=ns.sasl_password,
            )
        if ns.ssl_ca:
            kwargs["ssl_cafile"] = ns.ssl_ca
        if ns.ssl_cert:
            kwargs.update(ssl_certfile=ns.ssl_cert, ssl_keyfile=ns.ssl_key)
        return KafkaAdminClient(**kwargs)


def _open_meta(ns: argparse.Namespace) -> Any:
    from broker.meta.base import open_meta

    return open_meta(ns.meta, ns.data_dir, ns.meta_prefix, etcd_auth=etcd_auth_of(vars(ns)))


def _target(pp: EnvParser, ns: argparse.Namespace) -> str:
    if bool(ns.bootstrap) == bool(ns.meta):
        pp.error("give exactly one of --bootstrap (running cluster) or --meta (stopped)")
    return "admin" if ns.bootstrap else "meta"


# ------------------------------------------------------------------ kafscale users


def _users_parser() -> EnvParser:
    pp = EnvParser("kafscale users", "SCRAM users (create, delete, list).")
    _client_flags(pp)
    sub = pp.parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("create", help="create or update a user's SCRAM credentials")
    c.add_argument("name")
    c.add_argument("--password", help="the password (default: KAFSCALE_USER_PASSWORD, or asked)")
    c.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS)
    d = sub.add_parser("delete", help="delete a user's SCRAM credentials")
    d.add_argument("name")
    for sp in (c, d):
        sp.add_argument("--mechanism", action="append", choices=sorted(HASHES),
                        help="SCRAM mechanism (repeatable; default both)")  # fmt: skip
    sub.add_parser("list", help="users and their SCRAM mechanisms")
    return pp


def users_main(argv: Sequence[str], out: TextIO | None = None) -> int:
    out = out or sys.stdout
    pp = _users_parser()
    ns = pp.parse_args(argv)
    target = _target(pp, ns)
    mechs = sorted(ns.mechanism or HASHES) if ns.command in ("create", "delete") else []
    password = ""
    if ns.command == "create":
        import os

        password = ns.password or os.environ.get("KAFSCALE_USER_PASSWORD") or ""
        if not password:
            password = getpass.getpass(f"password for {ns.name}: ")
        if not password:
            pp.error("an empty password is not accepted")
    try:
        if target == "admin":
            return _users_admin(ns, mechs, password, out)
        return asyncio.run(_users_meta(ns, mechs, password, out))
    except Exception as exc:  # noqa: BLE001 - one line for the operator
        print(f"kafscale users: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR


def _users_admin(ns: argparse.Namespace, mechs: list[str], password: str, out: TextIO) -> int:
    from kafka.admin import UserScramCredentialDeletion, UserScramCredentialUpsertion

    admin = _admin(ns)
    try:
        if ns.command == "list":
            for user, info in sorted(admin.describe_user_scram_credentials().items()):
                ms = ",".join(
                    f"{ci['mechanism'].name.replace('_', '-')}:{ci['iterations']}"
                    for ci in info["credential_infos"]
                )
                out.write(f"{user} {ms}\n")
            return EXIT_OK
        if ns.command == "create":
            alterations: list[Any] = [
                UserScramCredentialUpsertion(ns.name, m, password, iterations=ns.iterations)
                for m in mechs
            ]
        else:
            if not ns.mechanism:  # every mechanism the user has
                info = admin.describe_user_scram_credentials([ns.name]).get(ns.name) or {}
                found = [ci["mechanism"].name.replace("_", "-") for ci in
                         info.get("credential_infos", [])]  # fmt: skip
                mechs = found or mechs
            alterations = [UserScramCredentialDeletion(ns.name, m) for m in mechs]
        errors = admin.alter_user_scram_credentials(alterations)
        failed = {u: e for u, e in errors.items() if e}
        for user, err in failed.items():
            print(f"kafscale users: {user}: {err}", file=sys.stderr)
        if not failed:
            out.write(f"{ns.command}d {ns.name} ({', '.join(mechs)})\n")
        return EXIT_ERROR if failed else EXIT_OK
    finally:
        admin.close()


async def _users_meta(ns: argparse.Namespace, mechs: list[str], password: str, out: TextIO) -> int:
    from broker.security.store import CredentialStore

    meta = _open_meta(ns)
    try:
        store = CredentialStore(meta)
        if ns.command == "list":
            for user, ms in sorted((await store.users()).items()):
                out.write(f"{user} {','.join(f'{k}:{v}' for k, v in sorted(ms.items()))}\n")
            return EXIT_OK
        if ns.command == "create":
            for m in mechs:
                await store.put(ns.name, m, make_credential(m, password, ns.iterations))
        else:
            found = [await store.delete(ns.name, m) for m in mechs]
            if not any(found):
                print(f"kafscale users: {ns.name}: no such user", file=sys.stderr)
                return EXIT_ERROR
        out.write(f"{ns.command}d {ns.name} ({', '.join(mechs)})\n")
        return EXIT_OK
    finally:
        await meta.close()


# ------------------------------------------------------------------ kafscale acls

_OPS = {op.name.replace("_", "").lower(): op for op in Operation if op > Operation.ANY}


def _op(text: str) -> Operation:
    key = text.replace("_", "").replace("-", "").lower()
    if key not in _OPS:
        raise argparse.ArgumentTypeError(f"unknown operation {text!r}")
    return _OPS[key]


def _acls_parser() -> EnvParser:
    pp = EnvParser("kafscale acls", "ACL bindings (add, remove, list).")
    _client_flags(pp)
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


def acls_main(argv: Sequence[str], out: TextIO | None = None) -> int:
    out = out or sys.stdout
    pp = _acls_parser()
    ns = pp.parse_args(argv)
    target = _target(pp, ns)
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

    admin = _admin(ns)

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

    meta = _open_meta(ns)
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


__all__ = ["MECHANISM_IDS", "acls_main", "add_broker_flags", "security_config", "users_main"]
