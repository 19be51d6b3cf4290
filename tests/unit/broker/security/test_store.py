"""The ACL and credential stores on the embedded metadata store: create/delete in chunks
(more bindings than one etcd transaction may hold), the watch feeding the authorizer, and
credentials never holding a password."""

from __future__ import annotations

import asyncio
from pathlib import Path

from broker.meta.embedded import EmbeddedStore
from broker.security.acl import (
    AclBinding,
    AclFilter,
    Authorizer,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from broker.security.scram import make_credential
from broker.security.store import AclStore, CredentialStore


def binding(i: int) -> AclBinding:
    return AclBinding(ResourceType.TOPIC, PatternType.LITERAL, f"t{i}", "User:a", "*",
                      Operation.READ, Permission.ALLOW)  # fmt: skip


def test_acl_store_watch_and_chunks(tmp_path: Path) -> None:
    async def run() -> None:
        meta = EmbeddedStore(str(tmp_path / "meta"))
        authz = Authorizer()
        store = AclStore(meta, authz.load)
        await store.start()
        try:
            store.changed.clear()
            await store.create([binding(i) for i in range(300)])
            async with asyncio.timeout(30):
                while len(store.bindings) < 300:
                    store.changed.clear()
                    await store.changed.wait()
            assert authz.authorize("User:a", "h", Operation.DESCRIBE, ResourceType.TOPIC, "t299")
            everything = AclFilter(ResourceType.ANY, PatternType.ANY, None, None, None,
                                   Operation.ANY, Permission.ANY)  # fmt: skip
            (deleted,) = await store.delete([everything])
            assert len(deleted) == 300
            async with asyncio.timeout(30):
                while store.bindings:
                    store.changed.clear()
                    await store.changed.wait()
            assert not authz.authorize("User:a", "h", Operation.READ, ResourceType.TOPIC, "t1")
        finally:
            await store.stop()
            await meta.close()

    asyncio.run(run())


def test_credentials_hold_no_password(tmp_path: Path) -> None:
    async def run() -> None:
        meta = EmbeddedStore(str(tmp_path / "meta"))
        try:
            creds = CredentialStore(meta)
            secret = "correct horse battery staple"
            await creds.put("alice", "SCRAM-SHA-256", make_credential("SCRAM-SHA-256", secret))
            raw = b"".join(kv.value for kv in await meta.range("/"))
            assert secret.encode() not in raw
            assert await creds.users() == {"alice": {"SCRAM-SHA-256": 4096}}
            assert await creds.delete("alice", "SCRAM-SHA-256")
            assert await creds.users() == {}
        finally:
            await meta.close()

    asyncio.run(run())
