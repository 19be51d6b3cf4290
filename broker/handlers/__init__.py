"""Per-API request handlers, one module per API family; the route table is ``routes.py``."""

from __future__ import annotations

from broker.handlers.registry import ApiHandler, Encoded, RequestContext, Routes

__all__ = ["ApiHandler", "Encoded", "RequestContext", "Routes"]
