"""Object-store and metadata-store wrappers that time every call (docs/operations.md,
"Metrics"): the write and read paths are instrumented at their store boundaries, not
throughout the code that calls them.

``InstrumentedStore`` wraps an ``ObjectStore``: latency by operation, errors, bytes put
and got. ``InstrumentedMeta`` wraps a ``MetaStore``: latency by operation, errors, and
transactions whose compares failed, by cause: ``fenced`` (the transaction was guarded by
an owner key's value: a manifest commit; the flusher treats its failure as a lost
ownership), ``exists`` (a create-if-absent found the key: a take, a topic creation) and
``revision`` (a revision or version guard moved: a concurrent writer). Everything else
(attributes such as ``max_txn_ops``) passes through to the wrapped store.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from broker.meta.base import Compare, KeyValue, MetaStore, Op, TxnResult, WatchEvent
from broker.meta.schema import OWNERS_PREFIX
from broker.telemetry import Family, Hist, Telemetry
from segments.store import (
    Buffer,
    ObjectInfo,
    ObjectStore,
    PutItem,
    batches_puts,
    put_background,
    put_each,
)

_now = time.perf_counter


class _Timed:
    """Latency histograms and error counters keyed by operation."""

    def __init__(self, latency: Family, errors: Family) -> None:
        self.latency = latency
        self.errors = errors
        self._hists: dict[str, Hist] = {}

    def hist(self, op: str) -> Hist:
        h = self._hists.get(op)
        if h is None:
            h = self._hists[op] = self.latency.child(op)
            self.errors.inc((op,), 0)
        return h

    def failed(self, op: str) -> None:
        self.errors.inc((op,))


class InstrumentedStore:
    """An ``ObjectStore`` that records each call's latency, errors and bytes."""

    def __init__(self, inner: ObjectStore, telemetry: Telemetry) -> None:
        self.inner = inner
        self._t = _Timed(
            telemetry.histogram(
                "store_request_duration_seconds", "Object store call latency, by op.", ("op",)
            ),
            telemetry.counter("store_errors", "Object store calls that failed, by op.", ("op",)),
        )
        self._bytes = telemetry.counter(
            "store_bytes", "Bytes written (put) and read (get) in the object store.", ("op",)
        )
        self._bytes.inc(("put",), 0)
        self._bytes.inc(("get",), 0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def put_many_if_absent(
        self, items: Sequence[PutItem], concurrency: int
    ) -> list[str | BaseException]:
        """``segments.store.put_all``: the inner store's batch PUT when it has one (each
        object counts as one put that took the batch's time), else one timed put each."""
        if not batches_puts(self.inner):
            return await put_each(self, items, concurrency)
        h = self._t.hist("put")
        start = _now()
        results: list[str | BaseException] = await self.inner.put_many_if_absent(  # type: ignore[attr-defined]
            items, concurrency
        )
        took = _now() - start
        for item, res in zip(items, results, strict=True):
            h.observe(took)
            if isinstance(res, BaseException):
                self._t.failed("put")
            else:
                self._bytes.inc(("put",), sum(len(b) for b in item.data))
        return results

    async def _call(self, op: str, coro: Any) -> Any:
        h = self._t.hist(op)
        start = _now()
        try:
            result = await coro
        except BaseException:
            self._t.failed(op)
            raise
        finally:
            h.observe(_now() - start)
        return result

    async def put_if_absent(
        self, key: str, data: Sequence[Buffer], *, crc32c: int | None = None
    ) -> str:
        put = self.inner.put_if_absent(key, data, crc32c=crc32c)
        etag: str = await self._call("put", put)
        self._bytes.inc(("put",), sum(len(b) for b in data))
        return etag

    async def put_paced_if_absent(
        self, key: str, data: Sequence[Buffer], *, crc32c: int | None = None
    ) -> str:
        """``segments.store.put_background``: the inner store's paced PUT, timed and
        counted as a put (its plain PUT where it has none)."""
        put = put_background(self.inner, key, data, crc32c=crc32c)
        etag: str = await self._call("put", put)
        self._bytes.inc(("put",), sum(len(b) for b in data))
        return etag

    async def get(
        self,
        key: str,
        start: int | None = None,
        end: int | None = None,
        if_match: str | None = None,
    ) -> bytes:
        data: bytes = await self._call("get", self.inner.get(key, start, end, if_match))
        self._bytes.inc(("get",), len(data))
        return data

    async def get_buffer(
        self,
        key: str,
        start: int | None = None,
        end: int | None = None,
        if_match: str | None = None,
    ) -> Buffer:
        """The read path's GET (``S3Store.get_buffer``; ``get`` on other stores), timed
        and counted as a get."""
        inner = getattr(self.inner, "get_buffer", None)
        if inner is None:
            return await self.get(key, start, end, if_match)
        data: Buffer = await self._call("get", inner(key, start, end, if_match))
        self._bytes.inc(("get",), len(data))
        return data

    async def get_parts(
        self, key: str, lo: int, hi: int, part: int, if_match: str | None = None
    ) -> Buffer | None:
        """``S3Store.get_parts`` (None on other stores), timed and counted as a get."""
        inner = getattr(self.inner, "get_parts", None)
        if inner is None:
            return None
        data: Buffer | None = await self._call("get", inner(key, lo, hi, part, if_match))
        self._bytes.inc(("get",), len(data) if data is not None else 0)
        return data

    async def head(self, key: str) -> ObjectInfo | None:
        info: ObjectInfo | None = await self._call("head", self.inner.head(key))
        return info

    async def delete(self, key: str) -> None:
        await self._call("delete", self.inner.delete(key))

    async def list(self, prefix: str) -> list[ObjectInfo]:
        found: list[ObjectInfo] = await self._call("list", self.inner.list(prefix))
        return found

    async def close(self) -> None:
        await self.inner.close()


def conflict_cause(compares: Sequence[Compare]) -> str:
    """Why a transaction guarded by ``compares`` most likely failed (see the module doc)."""
    if any(c.key.startswith(OWNERS_PREFIX) and c.target == "value" for c in compares):
        return "fenced"
    if any(c.target == "create_revision" and c.value == 0 for c in compares):
        return "exists"
    return "revision"


class InstrumentedMeta:
    """A ``MetaStore`` that records each call's latency, errors and failed compares."""

    def __init__(self, inner: MetaStore, telemetry: Telemetry) -> None:
        self.inner = inner
        self.max_txn_ops = inner.max_txn_ops
        self._t = _Timed(
            telemetry.histogram(
                "meta_request_duration_seconds",
                "Metadata store (etcd or embedded) call latency, by operation.",
                ("op",),
            ),
            telemetry.counter(
                "meta_errors", "Metadata store calls that failed, by operation.", ("op",)
            ),
        )
        self._conflicts = telemetry.counter(
            "meta_txn_conflicts",
            "Metadata transactions whose compares failed, by cause (fenced, exists, revision).",
            ("cause",),
        )
        for cause in ("fenced", "exists", "revision"):
            self._conflicts.inc((cause,), 0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def _call(self, op: str, coro: Any) -> Any:
        h = self._t.hist(op)
        start = _now()
        try:
            result = await coro
        except BaseException:
            self._t.failed(op)
            raise
        finally:
            h.observe(_now() - start)
        return result

    async def get(self, key: str) -> KeyValue | None:
        kv: KeyValue | None = await self._call("get", self.inner.get(key))
        return kv

    async def range(self, prefix: str) -> list[KeyValue]:
        kvs: list[KeyValue] = await self._call("range", self.inner.range(prefix))
        return kvs

    async def keys(self, prefix: str) -> list[str]:
        keys: list[str] = await self._call("range", self.inner.keys(prefix))
        return keys

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        rev: int = await self._call("put", self.inner.put(key, value, lease))
        return rev

    async def delete(self, key: str, prefix: bool = False) -> int:
        n: int = await self._call("delete", self.inner.delete(key, prefix))
        return n

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        res: TxnResult = await self._call("txn", self.inner.txn(compares, success, failure))
        if not res.succeeded and compares:
            self._conflicts.inc((conflict_cause(compares),))
        return res

    async def grant_lease(self, ttl: int) -> int:
        lease: int = await self._call("grant_lease", self.inner.grant_lease(ttl))
        return lease

    async def refresh_lease(self, lease_id: int) -> int:
        ttl: int = await self._call("refresh_lease", self.inner.refresh_lease(lease_id))
        return ttl

    async def revoke_lease(self, lease_id: int) -> None:
        await self._call("revoke_lease", self.inner.revoke_lease(lease_id))

    def watch(
        self, prefix: str, start_revision: int | None = None
    ) -> AsyncGenerator[WatchEvent, None]:
        return self.inner.watch(prefix, start_revision)

    async def close(self) -> None:
        await self.inner.close()
