"""etcd over TLS and with a user and password (docs/operations.md, "Security").

``EtcdAuth`` carries the options (``--etcd-ca``, ``--etcd-cert``, ``--etcd-key``,
``--etcd-user``, ``--etcd-password`` and their ``KAFSCALE_*`` variables).
:class:`SecureClient` is aetcd's client on a TLS gRPC channel (aetcd opens plaintext
channels only); the files are read at every (re)connect, so rotated certificates are
picked up when the store reconnects. With a user, aetcd authenticates on connect and
sends the token with every call; an expired token (UNAUTHENTICATED) makes the store
reconnect, which authenticates again (``broker.meta.etcd``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aetcd
import grpc
from aetcd import rpc, watcher


@dataclass(frozen=True, slots=True)
class EtcdAuth:
    username: str | None = None
    password: str | None = None
    ca: str | None = None  # PEM bundle the server certificate is verified against
    cert: str | None = None  # client certificate (etcd --client-cert-auth)
    key: str | None = None

    @property
    def tls(self) -> bool:
        return bool(self.ca or self.cert)

    def __repr__(self) -> str:  # never the password
        return f"EtcdAuth(user={self.username!r}, tls={self.tls})"


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


class SecureClient(aetcd.Client):
    """aetcd's client over TLS (and/or with a user)."""

    def __init__(
        self, host: str, port: int, auth: EtcdAuth, options: dict[str, Any] | None = None
    ) -> None:
        super().__init__(
            host=host, port=port, username=auth.username, password=auth.password, options=options
        )
        self._auth = auth

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        if not self._auth.tls:
            await super().connect()
            return
        try:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(self._auth.ca),
                private_key=_read(self._auth.key),
                certificate_chain=_read(self._auth.cert),
            )
            target = f"{self._host}:{self._port}"
            self.channel = rpc.secure_channel(target, creds, options=self._options.items())
            if self._username is not None and self._password is not None:
                self.auth_stub = rpc.AuthStub(self.channel)
                req = rpc.AuthenticateRequest(name=self._username, password=self._password)
                resp = await self.auth_stub.Authenticate(req, timeout=self._timeout)
                self.metadata = (("token", resp.token),)
            self.kvstub = rpc.KVStub(self.channel)
            self.clusterstub = rpc.ClusterStub(self.channel)
            self.leasestub = rpc.LeaseStub(self.channel)
            self.maintenancestub = rpc.MaintenanceStub(self.channel)
            self._watcher = watcher.Watcher(
                rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
            )
            self._connected.set()
        except rpc.AioRpcError as exc:
            raise aetcd.ConnectionFailedError(exc.details() or str(exc.code())) from exc
        except OSError as exc:
            raise aetcd.ConnectionFailedError(str(exc)) from exc
