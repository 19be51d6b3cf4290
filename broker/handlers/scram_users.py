"""DescribeUserScramCredentials (50) v0 and AlterUserScramCredentials (51) v0
(docs/operations.md, "Security").

Credentials are stored as Kafka stores them (salt, iterations, StoredKey, ServerKey),
computed from the salted password the client sends. Iterations outside 4096-16384 get
UNACCEPTABLE_CREDENTIAL, an unknown mechanism UNSUPPORTED_SASL_MECHANISM, a user named
twice for one mechanism DUPLICATE_RESOURCE, deleting a missing credential
RESOURCE_NOT_FOUND. Describing needs DESCRIBE on the cluster, altering ALTER.
"""

from __future__ import annotations

import logging
from typing import Any

from kafka.protocol.admin import (
    AlterUserScramCredentialsResponse,
    DescribeUserScramCredentialsResponse,
)

from broker.handlers.registry import RequestContext
from broker.meta.base import MetaStoreError
from broker.security.authz import Operation, allowed_cluster
from broker.security.scram import (
    MAX_ITERATIONS,
    MECHANISM_IDS,
    MECHANISM_NAMES,
    MIN_ITERATIONS,
    from_salted,
)
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)

_Described = DescribeUserScramCredentialsResponse.DescribeUserScramCredentialsResult
_Info = _Described.CredentialInfo
_Altered = AlterUserScramCredentialsResponse.AlterUserScramCredentialsResult


async def describe_user_scram_credentials(ctx: RequestContext, request: Any) -> Any:
    def top(code: ErrorCode, message: str | None = None) -> Any:
        return DescribeUserScramCredentialsResponse(
            throttle_time_ms=0, error_code=int(code), error_message=message, results=[]
        )

    if not allowed_cluster(ctx, Operation.DESCRIBE):
        return top(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    try:
        users = await ctx.broker.security.credentials.users()  # type: ignore[attr-defined]
    except MetaStoreError as exc:
        log.warning("reading SCRAM users failed: %s", exc)
        return top(ErrorCode.UNKNOWN_SERVER_ERROR, "metadata store unavailable")
    names = [u.name for u in request.users] if request.users else sorted(users)
    results = []
    for name in dict.fromkeys(names):
        if names.count(name) > 1:
            results.append(
                _Described(user=name, error_code=int(ErrorCode.DUPLICATE_RESOURCE),
                           error_message="user named twice", credential_infos=[])
            )  # fmt: skip
        elif name not in users:
            results.append(
                _Described(user=name, error_code=int(ErrorCode.RESOURCE_NOT_FOUND),
                           error_message="no SCRAM credentials", credential_infos=[])
            )  # fmt: skip
        else:
            infos = [
                _Info(mechanism=MECHANISM_IDS[m], iterations=i)
                for m, i in sorted(users[name].items())
                if m in MECHANISM_IDS
            ]
            results.append(
                _Described(user=name, error_code=0, error_message=None, credential_infos=infos)
            )
    return DescribeUserScramCredentialsResponse(
        throttle_time_ms=0, error_code=0, error_message=None, results=results
    )


def _check(name: str, mech: int, seen: dict[tuple[str, int], int]) -> tuple[ErrorCode, str] | None:
    if not name:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, "empty user name"
    if mech not in MECHANISM_NAMES:
        return ErrorCode.UNSUPPORTED_SASL_MECHANISM, "unknown SCRAM mechanism"
    if seen[(name, mech)] > 1:
        return ErrorCode.DUPLICATE_RESOURCE, "user and mechanism named twice"
    return None


async def alter_user_scram_credentials(ctx: RequestContext, request: Any) -> Any:
    ops = [("del", d) for d in request.deletions] + [("put", u) for u in request.upsertions]
    if not allowed_cluster(ctx, Operation.ALTER):
        results = [
            _Altered(user=o.name, error_code=int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED),
                     error_message=None)
            for _, o in ops
        ]  # fmt: skip
        return AlterUserScramCredentialsResponse(throttle_time_ms=0, results=results)
    creds = ctx.broker.security.credentials  # type: ignore[attr-defined]
    seen: dict[tuple[str, int], int] = {}
    for _, o in ops:
        seen[(o.name, o.mechanism)] = seen.get((o.name, o.mechanism), 0) + 1
    errors: dict[str, tuple[ErrorCode, str]] = {}
    for kind, o in ops:
        if o.name in errors:
            continue
        bad = _check(o.name, o.mechanism, seen)
        if bad is None and kind == "put":
            if not MIN_ITERATIONS <= o.iterations <= MAX_ITERATIONS:
                bad = (ErrorCode.UNACCEPTABLE_CREDENTIAL,
                       f"iterations must be {MIN_ITERATIONS}..{MAX_ITERATIONS}")  # fmt: skip
            elif not o.salt or not o.salted_password:
                bad = (ErrorCode.UNACCEPTABLE_CREDENTIAL, "empty salt or salted password")
        if bad is not None:
            errors[o.name] = bad
    try:
        for kind, o in ops:
            if o.name in errors:
                continue
            mech = MECHANISM_NAMES[o.mechanism]
            if kind == "del":
                if not await creds.delete(o.name, mech):
                    errors[o.name] = (ErrorCode.RESOURCE_NOT_FOUND, "no such credential")
            else:
                cred = from_salted(mech, bytes(o.salted_password), bytes(o.salt), o.iterations)
                await creds.put(o.name, mech, cred)
    except MetaStoreError as exc:
        log.warning("altering SCRAM credentials failed: %s", exc)
        for _, o in ops:
            errors.setdefault(o.name, (ErrorCode.UNKNOWN_SERVER_ERROR, "store unavailable"))
    results = []
    for name in dict.fromkeys(o.name for _, o in ops):
        code, msg = errors.get(name, (ErrorCode.NONE, None))
        results.append(_Altered(user=name, error_code=int(code), error_message=msg))
    return AlterUserScramCredentialsResponse(throttle_time_ms=0, results=results)
