"""SCRAM credentials and ACL bindings in the metadata store (keys: ``broker.meta.schema``).

Credentials are read on each login (a single key get). ACLs are cached: the whole set is
read at start and then followed through a watch on ``/security/acls/``; every change
rebuilds the authorizer's index at once, so a binding created through any broker is in
force on every broker as soon as the watch delivers it. A failed watch re-reads
everything and watches again (as ``broker.cluster`` does).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable

from broker.meta.base import Delete, Get, MetaStore, MetaStoreError, Put
from broker.meta.schema import (
    ACLS_PREFIX,
    SCRAM_PREFIX,
    acl_key,
    scram_key,
    scram_of_key,
    scram_user_prefix,
)
from broker.security.acl import AclBinding, AclFilter
from broker.security.scram import ScramCredential
from broker.tasks import cancel_and_wait

log = logging.getLogger(__name__)

WATCH_RETRY_S = 0.5
TXN_CHUNK = 64  # bindings per metadata transaction (etcd allows 128 operations)


class CredentialStore:
    def __init__(self, meta: MetaStore) -> None:
        self.meta = meta

    async def scram(self, user: str, mechanism: str) -> ScramCredential | None:
        kv = await self.meta.get(scram_key(user, mechanism))
        if kv is None:
            return None
        try:
            return ScramCredential.from_json(json.loads(kv.value))
        except (ValueError, KeyError, TypeError):
            log.warning("unreadable SCRAM credential for a user; treated as absent")
            return None

    async def put(self, user: str, mechanism: str, cred: ScramCredential) -> None:
        await self.meta.put(scram_key(user, mechanism), json.dumps(cred.to_json()).encode())

    async def delete(self, user: str, mechanism: str) -> bool:
        return await self.meta.delete(scram_key(user, mechanism)) > 0

    async def users(self) -> dict[str, dict[str, int]]:
        """user -> {mechanism: iterations}."""
        out: dict[str, dict[str, int]] = {}
        for kv in await self.meta.range(SCRAM_PREFIX):
            um = scram_of_key(kv.key)
            if um is None:
                continue
            try:
                iterations = int(json.loads(kv.value)["iterations"])
            except (ValueError, KeyError, TypeError):
                continue
            out.setdefault(um[0], {})[um[1]] = iterations
        return out

    async def delete_user(self, user: str) -> int:
        return await self.meta.delete(scram_user_prefix(user), prefix=True)


class AclStore:
    """The ACL bindings, cached and watched; ``on_change`` gets the full set."""

    def __init__(self, meta: MetaStore, on_change: Callable[[list[AclBinding]], None]) -> None:
        self.meta = meta
        self.on_change = on_change
        self.bindings: dict[str, AclBinding] = {}
        self.changed = asyncio.Event()  # set on every change (tests, diagnostics)
        self._task: asyncio.Task[None] | None = None
        self._pending = False

    async def start(self) -> None:
        rev = await self._sync()
        self._task = asyncio.create_task(self._watch(rev), name="watch-acls")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    async def _sync(self) -> int:
        res = await self.meta.txn([], [Get(ACLS_PREFIX, True)])
        self.bindings = {}
        for kv in res.gets[0]:
            self._apply("put", kv.key, kv.value)
        self._publish()
        return res.revision

    def _apply(self, kind: str, key: str, value: bytes) -> None:
        if kind == "delete":
            self.bindings.pop(key, None)
            return
        try:
            self.bindings[key] = AclBinding.from_json(value)
        except (ValueError, TypeError):
            log.warning("unreadable ACL binding at %s; ignored", key)

    def _publish(self) -> None:
        self._pending = False
        self.on_change(list(self.bindings.values()))
        self.changed.set()

    def _publish_soon(self) -> None:
        """One rebuild for a burst of events (a transaction of many bindings arrives as
        many events in one read): scheduled once, run when the loop comes round."""
        if not self._pending:
            self._pending = True
            asyncio.get_running_loop().call_soon(self._publish)

    async def _watch(self, revision: int) -> None:
        while True:
            watch = self.meta.watch(ACLS_PREFIX, start_revision=revision + 1)
            try:
                async for ev in watch:
                    revision = ev.mod_revision
                    self._apply(ev.type, ev.key, ev.value)
                    self._publish_soon()
            except MetaStoreError as exc:
                log.warning("ACL watch failed (%s); re-reading", exc)
                while True:
                    await asyncio.sleep(WATCH_RETRY_S)  # back off before reconnecting
                    try:
                        revision = await self._sync()
                        break
                    except MetaStoreError as exc2:
                        log.warning("re-reading ACLs failed (%s); retrying", exc2)
            finally:
                await watch.aclose()

    async def create(self, bindings: list[AclBinding]) -> None:
        """Store the bindings (idempotent: a binding is keyed by its content)."""
        puts = []
        for b in bindings:
            value = b.to_json()
            puts.append(Put(acl_key(value), value))
        for i in range(0, len(puts), TXN_CHUNK):  # etcd caps the operations of a txn
            await self.meta.txn([], puts[i : i + TXN_CHUNK])

    async def delete(self, filters: list[AclFilter]) -> list[list[AclBinding]]:
        """Delete the bindings each filter matches (read from the store, not the cache);
        returns them per filter."""
        current: dict[str, AclBinding] = {}
        for kv in await self.meta.range(ACLS_PREFIX):
            with contextlib.suppress(ValueError, TypeError):
                current[kv.key] = AclBinding.from_json(kv.value)
        out: list[list[AclBinding]] = []
        doomed: set[str] = set()
        for f in filters:
            keys = [k for k, b in current.items() if f.matches(b)]
            out.append([current[k] for k in keys])
            doomed.update(keys)
        deletes = [Delete(k) for k in sorted(doomed)]
        for i in range(0, len(deletes), TXN_CHUNK):
            await self.meta.txn([], deletes[i : i + TXN_CHUNK])
        return out

    def describe(self, f: AclFilter) -> list[AclBinding]:
        return [b for b in self.bindings.values() if f.matches(b)]
