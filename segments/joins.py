"""One buffer of many, copied without the GIL.

``b"".join`` drops the GIL while it copies only when every item is a ``bytes`` object. A
segment's pieces are memoryviews (of request frames, of the segments a merge reads, of
ranged GETs), so joining a 16 MiB segment in a worker thread still held the GIL for
~8 ms, and the event loop could not run meanwhile (docs/benchmarks.md, "Round 20").
``join`` copies through ``segments/_localio.c`` when it is built, and falls back to
``b"".join`` (same bytes) when it is not. Callers run it in a thread for large joins; no
caller writes to the buffers while they are joined.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from segments.store import Buffer

_native: Callable[[Sequence[Buffer]], bytes] | None
try:  # optional: a build without the extension joins with b"".join
    from segments import _localio  # type: ignore[attr-defined]

    _native = _localio.join
except ImportError:  # pragma: no cover - a build without the extension
    _native = None


def join(buffers: Sequence[Buffer]) -> bytes:
    """The buffers' bytes, one after the other (the GIL released while copying when the
    native module is built)."""
    if _native is not None:
        return _native(buffers)
    return b"".join(buffers)
