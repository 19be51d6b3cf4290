"""The metadata-store interface: a small async subset of etcd v3.

Implementations: ``broker.meta.embedded.EmbeddedStore`` (single node, durable in the data
directory; URL ``embedded`` or ``embedded:///PATH``) and ``broker.meta.etcd.EtcdStore``
(aetcd; URL ``etcd://HOST:PORT[,HOST:PORT...]``), chosen by ``open_meta(url, ...)``. The
factory imports the implementation of the URL lazily; that import of the implementations
(which import this interface) is the one import cycle the package allows.

Keys are strings relative to the store's prefix (default ``/kafscale``): callers say
``/topics/orders`` and the store reads/writes ``/kafscale/topics/orders``. Values are bytes.
Revisions are store-wide and increase with every write, as in etcd.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from broker.meta.etcd_secure import EtcdAuth


class MetaStoreError(Exception):
    """The store could not be reached or failed the operation."""


class LeaseExpiredError(MetaStoreError):
    """The lease is gone (expired or revoked)."""


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Compare:
    """A transaction guard. ``target`` names the field compared with ``value``.

    For a missing key: version, create_revision and mod_revision compare as 0, and a
    ``value`` comparison is false.
    """

    key: str
    target: Literal["value", "version", "create_revision", "mod_revision"]
    op: Literal["==", "!=", "<", ">"]
    value: bytes | int


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Delete:
    key: str
    prefix: bool = False


@dataclass(frozen=True, slots=True)
class Get:
    key: str
    prefix: bool = False


Op = Put | Delete | Get


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int
    # one entry per Get op of the branch that ran, in order (sorted by key)
    gets: tuple[tuple[KeyValue, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: Literal["put", "delete"]
    key: str
    value: bytes  # b"" for deletes
    mod_revision: int


@runtime_checkable
class MetaStore(Protocol):
    #: the most operations one transaction may carry (etcd's default --max-txn-ops is 128)
    max_txn_ops: int

    async def get(self, key: str) -> KeyValue | None: ...

    async def range(self, prefix: str) -> list[KeyValue]:
        """Every key starting with ``prefix``, sorted by key."""
        ...

    async def keys(self, prefix: str) -> list[str]:
        """The keys ``range(prefix)`` would return, without their values (etcd sends
        none: a listing of groups need not carry every committed offset)."""
        ...

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        """Write ``key``; returns the new store revision."""
        ...

    async def delete(self, key: str, prefix: bool = False) -> int:
        """Delete ``key`` (or every key under it); returns how many were deleted."""
        ...

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        """Atomically: if every compare holds run ``success``, else ``failure``."""
        ...

    async def grant_lease(self, ttl: int) -> int:
        """A new lease of ``ttl`` seconds; returns its id. Keys put with it die with it."""
        ...

    async def refresh_lease(self, lease_id: int) -> int:
        """Keep the lease alive; returns the TTL granted. Raises LeaseExpiredError."""
        ...

    async def revoke_lease(self, lease_id: int) -> None: ...

    def watch(
        self, prefix: str, start_revision: int | None = None
    ) -> AsyncGenerator[WatchEvent, None]:
        """Events for keys under ``prefix`` from ``start_revision`` (inclusive, as in
        etcd) or, without one, from now. A lost connection raises MetaStoreError: watch
        again from the last revision seen + 1.

        The iterator runs until the consumer stops iterating (``aclose()`` / break).
        """
        ...

    async def close(self) -> None: ...


def etcd_endpoints(url: str) -> list[tuple[str, int]]:
    """The (host, port) pairs of ``etcd://HOST:PORT[,HOST:PORT...]``; ValueError naming
    the bad part otherwise."""
    if not url.startswith("etcd://"):
        raise ValueError(f"not an etcd URL: {url!r}")
    endpoints: list[tuple[str, int]] = []
    for part in url[len("etcd://") :].rstrip("/").split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"bad etcd endpoint {part!r} in {url!r} (want HOST:PORT)")
        endpoints.append((host.strip("[]"), int(port)))
    return endpoints


def check_meta_url(url: str) -> None:
    """ValueError, naming what is wrong, when ``open_meta`` would refuse ``url``; no I/O
    and nothing opened (a broker checks its flags with it before it starts anything)."""
    if url == "embedded" or url.startswith("embedded://"):
        return
    if url.startswith("etcd://"):
        etcd_endpoints(url)
        return
    raise ValueError(f"unsupported metadata store URL {url!r} (use embedded or etcd://)")


def open_meta(
    url: str,
    data_dir: str = "./data",
    prefix: str = "/kafscale",
    read_only: bool = False,
    etcd_auth: EtcdAuth | None = None,
) -> MetaStore:
    """Open a metadata store: ``embedded`` (in ``data_dir``), ``embedded:///PATH``, or
    ``etcd://HOST:PORT[,HOST:PORT...]``.

    ``read_only`` lets a second process (the ingest job, the CLI) read an embedded store
    that a running broker holds: it replays the durable state without taking the lock,
    and every write raises MetaStoreError. It has no effect on etcd.
    """
    check_meta_url(url)
    if url.startswith("etcd://"):
        from broker.meta.etcd import EtcdStore

        return EtcdStore.from_url(url, prefix=prefix, auth=etcd_auth)
    from broker.meta.embedded import EmbeddedStore

    path = url[len("embedded://") :] if url.startswith("embedded://") else None
    return EmbeddedStore(path or f"{data_dir}/meta", prefix=prefix, read_only=read_only)
