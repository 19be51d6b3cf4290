"""Security flags of ``kafscale broker``, the ``kafscale users`` command and the client
connection flags it shares with ``kafscale acls`` (``broker/cli_acls.py``;
docs/operations.md, "Security").

    kafscale users create NAME [--password P] [--mechanism M ...] [--iterations N]
    kafscale users delete NAME [--mechanism M ...]
    kafscale users list

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
from broker.security.config import (
    DEFAULT_MECHANISMS,
    MECHANISMS,
    Listener,
    SecurityConfig,
    build_listeners,
    parse_protocol_map,
)
from broker.security.scram import DEFAULT_ITERATIONS, HASHES, make_credential

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
    pp.option("--registry-auth", "schema registry authentication: none (default) or basic "
              "(HTTP Basic against the SCRAM users)", choices=("none", "basic"))  # fmt: skip
    pp.option("--inter-broker-listener", "listener name brokers call each other on "
              "(default: PLAINTEXT if the peer has it, else its first)")  # fmt: skip
    pp.option("--inter-broker-sasl-mechanism", "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 "
              "(default) on a SASL inter-broker listener")  # fmt: skip
    pp.option("--inter-broker-sasl-username", "user brokers log in to each other as")
    pp.option("--inter-broker-sasl-password", "its password")


def _listeners(
    args: dict[str, Any], plaintext: tuple[str, int, str, int] | None
) -> tuple[Listener, ...]:
    """The named listeners of ``--listener`` (``plaintext`` first, as PLAINTEXT)."""
    specs = list(args.get("listener") or [])
    advertised = [a for a in args.get("advertised_named") or []]
    if not specs:
        if advertised:
            raise ValueError("NAME:// advertised listeners need --listener")
        return ()
    listeners = build_listeners(
        specs, advertised, parse_protocol_map(args.get("listener_security_protocol_map"))
    )
    if plaintext is None:
        return listeners
    if any(x.name == "PLAINTEXT" for x in listeners):
        raise ValueError("--listen and --listener PLAINTEXT:// both given")
    host, port, ahost, aport = plaintext
    return (Listener("PLAINTEXT", "PLAINTEXT", host, port, ahost, aport),) + listeners


def security_config(
    args: dict[str, Any], plaintext: tuple[str, int, str, int] | None
) -> SecurityConfig:
    """The SecurityConfig the flags describe. ``plaintext``: (host, port, advertised host,
    advertised port) of ``--listen`` when it is to be the PLAINTEXT listener too."""
    mechs = tuple(
        m.strip().upper() for m in (args.get("sasl_mechanisms") or "").split(",") if m.strip()
    )
    for m in mechs:
        if m not in MECHANISMS:
            raise ValueError(f"unknown SASL mechanism {m} (known: {', '.join(MECHANISMS)})")
    supers = tuple(s.strip() for s in (args.get("super_users") or "").split(";") if s.strip())
    values: dict[str, Any] = {
        "listeners": _listeners(args, plaintext),
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
        "registry_auth": args.get("registry_auth") or "none",
        "inter_broker_listener": args.get("inter_broker_listener"),
        "inter_broker_sasl_mechanism": (
            args.get("inter_broker_sasl_mechanism") or "SCRAM-SHA-512"
        ).upper(),
        "inter_broker_sasl_username": args.get("inter_broker_sasl_username"),
        "inter_broker_sasl_password": args.get("inter_broker_sasl_password"),
    }
    if args.get("sasl_auth_timeout_ms") is not None:
        values["auth_timeout_ms"] = int(args["sasl_auth_timeout_ms"])
    if args.get("max_reauth_ms") is not None:
        values["max_reauth_ms"] = int(args["max_reauth_ms"])
    if "OAUTHBEARER" in values["sasl_mechanisms"] and not values["oauth_jwks"]:
        raise ValueError("OAUTHBEARER needs --oauth-jwks")
    return SecurityConfig(**values)


# ------------------------------------------------------------------ client connection flags


def client_flags(pp: EnvParser) -> None:
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


def client_admin(ns: argparse.Namespace) -> Any:
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


def open_client_meta(ns: argparse.Namespace) -> Any:
    from broker.meta.base import open_meta

    return open_meta(ns.meta, ns.data_dir, ns.meta_prefix, etcd_auth=etcd_auth_of(vars(ns)))


def connect_target(pp: EnvParser, ns: argparse.Namespace) -> str:
    if bool(ns.bootstrap) == bool(ns.meta):
        pp.error("give exactly one of --bootstrap (running cluster) or --meta (stopped)")
    return "admin" if ns.bootstrap else "meta"


# ------------------------------------------------------------------ kafscale users


def _users_parser() -> EnvParser:
    pp = EnvParser("kafscale users", "SCRAM users (create, delete, list).")
    client_flags(pp)
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
    target = connect_target(pp, ns)
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

    admin = client_admin(ns)
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

    meta = open_client_meta(ns)
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


__all__ = [
    "add_broker_flags",
    "client_admin",
    "client_flags",
    "connect_target",
    "open_client_meta",
    "security_config",
    "users_main",
]
