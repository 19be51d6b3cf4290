"""Per-API request handlers, one module per API family, registered in one table.

Every module registers its handlers with ``@api(key, min_version, max_version)``; the
table (``REGISTRY``) is what the connection loop dispatches on and what ApiVersions
advertises. ``load_all()`` imports every module of the package so the table is complete.
"""

from __future__ import annotations

import importlib
import pkgutil

from broker.handlers.registry import REGISTRY, ApiHandler, Encoded, RequestContext, api

__all__ = ["REGISTRY", "ApiHandler", "Encoded", "RequestContext", "api", "load_all"]

_loaded = False


def load_all() -> dict[int, ApiHandler]:
    global _loaded
    if not _loaded:
        for mod in pkgutil.iter_modules(__path__):
            if mod.name != "registry":
                importlib.import_module(f"{__name__}.{mod.name}")
        _loaded = True
    return REGISTRY
