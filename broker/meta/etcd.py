"""The etcd v3 metadata store, on ``aetcd`` (its channel and generated gRPC stubs).

Requests are built from aetcd's protobuf messages and sent on its stubs so that every
``MetaStore`` operation is one round trip. The connection is opened lazily; a connection
failure (gRPC UNAVAILABLE) drops the channel and moves to the next endpoint, so the next call
reconnects. Reads and lease calls are retried once on a fresh channel; writes are not
(the outcome of a write cut off mid-flight is unknown) and raise ``MetaStoreError``.

aetcd has no background lease keep-alive: callers refresh leases themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import aetcd
from aetcd import rpc
from aetcd.utils import prefix_range_end
from grpc.aio import EOF

from broker.meta.base import (
    Compare,
    Delete,
    Get,
    KeyValue,
    LeaseExpiredError,
    MetaStoreError,
    Op,
    Put,
    TxnResult,
    WatchEvent,
    etcd_endpoints,
)
from broker.meta.etcd_secure import EtcdAuth, SecureClient

log = logging.getLogger(__name__)
T = TypeVar("T")

_OPS = {
    "==": rpc.Compare.EQUAL,
    "!=": rpc.Compare.NOT_EQUAL,
    "<": rpc.Compare.LESS,
    ">": rpc.Compare.GREATER,
}
_TARGETS = {
    "value": rpc.Compare.VALUE,
    "version": rpc.Compare.VERSION,
    "create_revision": rpc.Compare.CREATE,
    "mod_revision": rpc.Compare.MOD,
}
_CONNECTION_CODES = (rpc.StatusCode.UNAVAILABLE,)
#: gRPC takes no received message over 4 MiB by default: a range of a partition's segment
#: entries, of every committed offset's key or of every topic may be larger. etcd sends
#: answers of up to 2 GiB - 1, and Go's etcd client takes as much.
CHANNEL_OPTIONS = {"grpc.max_receive_message_length": 2**31 - 1}


@contextlib.asynccontextmanager
async def _stream_deadline(seconds: float, what: str) -> AsyncIterator[None]:
    """Bound steps of a gRPC stream by our own clock. grpc.aio makes a stream's first
    write wait, with no deadline, until its headers are sent: forever if its channel is
    closed before that (another call dropped it)."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise MetaStoreError(f"etcd {what} got no answer within {seconds:g}s") from None


class EtcdStore:
    """``MetaStore`` on an etcd v3 cluster."""

    max_txn_ops: int = 128

    def __init__(
        self,
        endpoints: list[tuple[str, int]],
        prefix: str = "/kafscale",
        timeout: float = 5.0,
        auth: EtcdAuth | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        self._endpoints = list(endpoints)
        self._next = 0
        self._prefix = prefix
        self._bprefix = prefix.encode()
        self._timeout = timeout
        self._client: aetcd.Client | None = None
        self._closed = False
        self._last_revision = 0
        self._auth = auth  # TLS and/or user (broker.meta.etcd_secure)

    @classmethod
    def from_url(
        cls,
        url: str,
        prefix: str = "/kafscale",
        timeout: float = 5.0,
        auth: EtcdAuth | None = None,
    ) -> EtcdStore:
        """``etcd://HOST:PORT[,HOST:PORT...]``"""
        return cls(etcd_endpoints(url), prefix=prefix, timeout=timeout, auth=auth)

    # ---------------------------------------------------------------- plumbing

    def _key(self, key: str) -> bytes:
        return self._bprefix + key.encode()

    def _range_end(self, full: bytes) -> bytes:
        return prefix_range_end(full) if full else b"\0"

    def _kv(self, kv: Any) -> KeyValue:
        return KeyValue(
            kv.key[len(self._bprefix) :].decode(),
            bytes(kv.value),
            kv.create_revision,
            kv.mod_revision,
            kv.version,
            kv.lease,
        )

    def _seen(self, header: Any) -> None:
        self._last_revision = max(self._last_revision, header.revision)

    async def _connect(self) -> aetcd.Client:
        if self._closed:
            raise MetaStoreError("metadata store is closed")
        if self._client is None:
            host, port = self._endpoints[self._next % len(self._endpoints)]
            client = (
                aetcd.Client(host=host, port=port, options=CHANNEL_OPTIONS)
                if self._auth is None
                else SecureClient(host, port, self._auth, CHANNEL_OPTIONS)
            )
            try:
                await client.connect()
            except aetcd.ClientError as exc:
                raise MetaStoreError(f"cannot connect to etcd at {host}:{port}: {exc}") from exc
            self._client = client
        return self._client

    async def _drop(self, client: aetcd.Client) -> None:
        """Forget ``client`` (if still current) and close its channel; next call reconnects."""
        current = self._client
        if current is None or current is not client:
            return
        self._client = None
        self._next += 1
        try:
            await current.close()
        except Exception as exc:  # noqa: BLE001 - the channel is being discarded
            log.debug("closing etcd channel: %s", exc)

    async def _call(self, fn: Callable[[aetcd.Client], Awaitable[T]], retry: bool) -> T:
        attempts = 2 if retry else 1
        for attempt in range(attempts):
            client = await self._connect()
            try:
                return await fn(client)
            except rpc.AioRpcError as exc:
                code, details = exc.code(), exc.details() or ""
                if code == rpc.StatusCode.NOT_FOUND and "lease not found" in details:
                    raise LeaseExpiredError(details) from exc
                if code in _CONNECTION_CODES or (
                    code == rpc.StatusCode.UNAUTHENTICATED and self._auth is not None
                ):  # an expired auth token: a new channel authenticates again
                    await self._drop(client)
                    if attempt + 1 < attempts:
                        log.info("etcd unavailable (%s); retrying on a new channel", details)
                        continue
                    raise MetaStoreError(f"etcd unavailable: {details}") from exc
                raise MetaStoreError(f"etcd {code.name}: {details}") from exc
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # our caller is being cancelled
                # the shared channel was closed under this call (another call dropped it
                # after a connection error): a connection failure, not a cancellation
                if attempt + 1 < attempts:
                    continue
                raise MetaStoreError("etcd channel closed during the call") from None
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------- KV

    async def get(self, key: str) -> KeyValue | None:
        req = rpc.RangeRequest(key=self._key(key))

        async def run(c: aetcd.Client) -> KeyValue | None:
            resp = await c.kvstub.Range(req, timeout=self._timeout, metadata=c.metadata)
            self._seen(resp.header)
            return self._kv(resp.kvs[0]) if resp.kvs else None

        return await self._call(run, retry=True)

    async def range(self, prefix: str) -> list[KeyValue]:
        full = self._key(prefix)
        req = rpc.RangeRequest(key=full, range_end=self._range_end(full))

        async def run(c: aetcd.Client) -> list[KeyValue]:
            resp = await c.kvstub.Range(req, timeout=self._timeout, metadata=c.metadata)
            self._seen(resp.header)
            return [self._kv(kv) for kv in resp.kvs]

        return await self._call(run, retry=True)

    async def keys(self, prefix: str) -> list[str]:
        full = self._key(prefix)
        req = rpc.RangeRequest(key=full, range_end=self._range_end(full), keys_only=True)
        cut = len(self._bprefix)

        async def run(c: aetcd.Client) -> list[str]:
            resp = await c.kvstub.Range(req, timeout=self._timeout, metadata=c.metadata)
            self._seen(resp.header)
            return [kv.key[cut:].decode() for kv in resp.kvs]

        return await self._call(run, retry=True)

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        req = rpc.PutRequest(key=self._key(key), value=bytes(value), lease=lease)

        async def run(c: aetcd.Client) -> int:
            resp = await c.kvstub.Put(req, timeout=self._timeout, metadata=c.metadata)
            self._seen(resp.header)
            return int(resp.header.revision)

        return await self._call(run, retry=False)

    async def delete(self, key: str, prefix: bool = False) -> int:
        full = self._key(key)
        req = rpc.DeleteRangeRequest(key=full)
        if prefix:
            req.range_end = self._range_end(full)

        async def run(c: aetcd.Client) -> int:
            resp = await c.kvstub.DeleteRange(req, timeout=self._timeout, metadata=c.metadata)
            self._seen(resp.header)
            return int(resp.deleted)

        return await self._call(run, retry=False)

    def _compare(self, c: Compare) -> Any:
        msg = rpc.Compare(key=self._key(c.key), result=_OPS[c.op], target=_TARGETS[c.target])
        if c.target == "value":
            if not isinstance(c.value, bytes | bytearray | memoryview):
                raise TypeError("a value compare needs bytes")
            msg.value = bytes(c.value)
        elif isinstance(c.value, int):
            setattr(msg, c.target, c.value)
        else:
            raise TypeError(f"a {c.target} compare needs an int")
        return msg

    def _op(self, op: Op) -> Any:
        full = self._key(op.key)
        if isinstance(op, Put):
            return rpc.RequestOp(
                request_put=rpc.PutRequest(key=full, value=bytes(op.value), lease=op.lease)
            )
        if isinstance(op, Delete):
            req = rpc.DeleteRangeRequest(key=full)
            if op.prefix:
                req.range_end = self._range_end(full)
            return rpc.RequestOp(request_delete_range=req)
        if isinstance(op, Get):
            rng = rpc.RangeRequest(key=full)
            if op.prefix:
                rng.range_end = self._range_end(full)
            return rpc.RequestOp(request_range=rng)
        raise TypeError(f"unknown txn op {op!r}")

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        if max(len(compares), len(success), len(failure)) > self.max_txn_ops:
            raise MetaStoreError("too many operations in txn request")
        req = rpc.TxnRequest(
            compare=[self._compare(c) for c in compares],
            success=[self._op(o) for o in success],
            failure=[self._op(o) for o in failure],
        )
        read_only = all(isinstance(o, Get) for o in (*success, *failure))

        async def run(c: aetcd.Client) -> TxnResult:
            resp = await c.kvstub.Txn(req, timeout=self._timeout, metadata=c.metadata)
            self._seen(resp.header)
            gets = tuple(
                tuple(self._kv(kv) for kv in r.response_range.kvs)
                for r in resp.responses
                if r.WhichOneof("response") == "response_range"
            )
            return TxnResult(bool(resp.succeeded), int(resp.header.revision), gets)

        return await self._call(run, retry=read_only)

    # ----------------------------------------------------------------- leases

    async def grant_lease(self, ttl: int) -> int:
        req = rpc.LeaseGrantRequest(TTL=int(ttl), ID=0)

        async def run(c: aetcd.Client) -> int:
            resp = await c.leasestub.LeaseGrant(req, timeout=self._timeout, metadata=c.metadata)
            if resp.error:
                raise MetaStoreError(f"etcd lease grant: {resp.error}")
            return int(resp.ID)

        return await self._call(run, retry=True)

    async def refresh_lease(self, lease_id: int) -> int:
        req = rpc.LeaseKeepAliveRequest(ID=lease_id)

        async def run(c: aetcd.Client) -> int:
            # the request as an iterator, written by grpc.aio's own task: a write of ours
            # would wait, with no deadline, until the stream's headers are sent, and
            # forever if the channel is closed before that (another call dropped it);
            # this way the read ends in CancelledError and _call retries on a new channel
            call = c.leasestub.LeaseKeepAlive(
                iter((req,)), timeout=self._timeout, metadata=c.metadata
            )
            try:
                async with _stream_deadline(self._timeout, "lease keep-alive"):
                    resp = await call.read()
            finally:
                call.cancel()
            if resp is EOF or resp.TTL <= 0:
                raise LeaseExpiredError(f"lease {lease_id:x} has expired or was revoked")
            return int(resp.TTL)

        return await self._call(run, retry=True)

    async def revoke_lease(self, lease_id: int) -> None:
        req = rpc.LeaseRevokeRequest(ID=lease_id)

        async def run(c: aetcd.Client) -> None:
            resp = await c.leasestub.LeaseRevoke(req, timeout=self._timeout, metadata=c.metadata)
            self._seen(resp.header)

        try:
            await self._call(run, retry=True)
        except LeaseExpiredError:
            pass  # already gone: revoking is idempotent

    # ------------------------------------------------------------------ watch

    def watch(
        self, prefix: str, start_revision: int | None = None
    ) -> AsyncGenerator[WatchEvent, None]:
        """Events under ``prefix`` with revision >= ``start_revision``; by default from the
        revision after the newest this store has seen (its last response), so a write made
        through this store before ``watch`` is called is never reported."""
        start = start_revision or (self._last_revision + 1 if self._last_revision else 0)
        return self._watch(self._key(prefix), start)

    async def _watch(self, full: bytes, start: int) -> AsyncGenerator[WatchEvent, None]:
        client = await self._connect()
        create = rpc.WatchCreateRequest(key=full, range_end=self._range_end(full))
        if start:
            create.start_revision = start
        call = rpc.WatchStub(client.channel).Watch(metadata=client.metadata)
        cut = len(self._bprefix)
        try:
            async with _stream_deadline(self._timeout, "watch"):
                await call.write(rpc.WatchRequest(create_request=create))
            while True:
                resp = await call.read()
                if resp is EOF:
                    raise MetaStoreError("etcd closed the watch stream")
                if resp.compact_revision:
                    raise MetaStoreError(
                        f"required revision {start} has been compacted "
                        f"(compact revision {resp.compact_revision})"
                    )
                if resp.canceled:
                    raise MetaStoreError(f"etcd cancelled the watch: {resp.cancel_reason}")
                for ev in resp.events:
                    kv = ev.kv
                    yield WatchEvent(
                        "delete" if ev.type == rpc.Event.DELETE else "put",
                        kv.key[cut:].decode(),
                        bytes(kv.value),
                        int(kv.mod_revision),
                    )
        except rpc.AioRpcError as exc:
            if exc.code() in _CONNECTION_CODES:
                await self._drop(client)
            raise MetaStoreError(f"etcd watch failed: {exc.details()}") from exc
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # our consumer is being cancelled
            # the shared channel was closed under the watch (another call failed with a
            # connection error and dropped it): a failed watch, not a cancellation
            raise MetaStoreError("etcd channel closed under the watch") from None
        finally:
            call.cancel()

    async def close(self) -> None:
        self._closed = True
        if self._client is not None:
            await self._drop(self._client)
