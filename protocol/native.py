"""Loading the optional native modules (built by setup.py; docs/architecture.md)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def load_native(name: str) -> ModuleType | None:
    """The native module ``name`` (e.g. ``protocol._fastrecords``), or None when it was
    not built or ``KAFSCALE_PURE_PYTHON`` asks for the pure-Python paths."""
    if os.environ.get("KAFSCALE_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
