"""What the broker holds for security (``Broker.security``): the TLS context, the
principal mapper, the credential and ACL stores and the authorizer."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from broker.meta.base import MetaStore
from broker.security.acl import AclBinding, Authorizer
from broker.security.config import Listener, SecurityConfig
from broker.security.sasl import ANONYMOUS, Session
from broker.security.store import AclStore, CredentialStore
from broker.security.tls import PrincipalMapper, ServerTls, peer_principal

if TYPE_CHECKING:
    from broker.security.oauth import JwtValidator

log = logging.getLogger(__name__)


class SecurityManager:
    def __init__(self, config: SecurityConfig, meta: MetaStore) -> None:
        self.config = config
        self.credentials = CredentialStore(meta)
        self.authorizer: Authorizer | None = (
            Authorizer(config.super_users, config.allow_everyone_if_no_acl_found)
            if config.authorizer
            else None
        )
        self.acls = AclStore(meta, self._acls_changed)
        self.mapper = PrincipalMapper(config.principal_mapping_rules)
        self.tls: ServerTls | None = None
        if any(x.tls for x in config.listeners):
            if not config.ssl_cert or not config.ssl_key:
                raise ValueError("SSL/SASL_SSL listeners need --ssl-cert and --ssl-key")
            self.tls = ServerTls(
                config.ssl_cert,
                config.ssl_key,
                config.ssl_ca,
                config.ssl_client_auth,
                config.ssl_key_password,
            )
        self.jwt: JwtValidator | None = None
        if "OAUTHBEARER" in config.sasl_mechanisms:
            from broker.security.oauth import JwtValidator

            self.jwt = JwtValidator(
                config.oauth_jwks,
                config.oauth_issuer,
                config.oauth_audience,
                config.oauth_principal_claim,
            )

    async def start(self) -> None:
        if self.authorizer is not None:  # without one, the ACL APIs say SECURITY_DISABLED
            await self.acls.start()

    async def stop(self) -> None:
        await self.acls.stop()

    def _acls_changed(self, bindings: list[AclBinding]) -> None:
        if self.authorizer is not None:
            self.authorizer.load(bindings)

    def ssl_context(self, listener: Listener) -> Any:
        return self.tls.base if listener.tls and self.tls is not None else None

    def session(self, listener: Listener | None, peercert: dict[str, Any] | None) -> Session:
        """A new connection's session; on SSL the principal is the client certificate's."""
        principal = ANONYMOUS
        if listener is not None and listener.protocol == "SSL" and peercert:
            mapped = peer_principal(peercert, self.mapper)
            principal = mapped or ANONYMOUS
        return Session(
            listener,
            principal,
            tuple(m for m in self.config.sasl_mechanisms if m != "OAUTHBEARER" or self.jwt),
            self.config.max_reauth_ms,
        )
