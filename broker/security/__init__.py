"""Security: listeners and TLS, SASL authentication, SCRAM credentials and ACL
authorization (docs/operations.md, "Security").

- :mod:`.config`: listeners (``NAME://HOST:PORT``) and the security settings.
- :mod:`.tls`: server TLS contexts (certificates re-read when their files change) and
  mTLS principals with ``ssl.principal.mapping.rules``.
- :mod:`.scram`, :mod:`.sasl`: the SASL server mechanisms and the per-connection
  authentication state machine (:class:`.sasl.Session`).
- :mod:`.acl`: ACL bindings, filters and the authorizer (Kafka's semantics).
- :mod:`.store`: SCRAM credentials and ACLs in the metadata store, watched.
- :mod:`.manager`: what the broker holds (``broker.security``); :mod:`.authz` the small
  calls handlers make.
"""
