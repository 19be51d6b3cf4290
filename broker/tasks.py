"""Ending background tasks without swallowing a cancellation.

``task.cancel()`` followed by ``with suppress(CancelledError): await task`` also swallows a
cancellation of the caller that comes while it waits: a stop() cancelled by its own
deadline went on as if nothing happened. ``cancel_and_wait`` lets the caller's cancellation
through.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)


async def cancel_and_wait(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel ``tasks`` (None ones skipped) and wait until every one has ended. What they
    raised (a task that had failed, or failed on its way out) is logged, not raised; a
    cancellation of the caller while it waits is raised."""
    live = [t for t in tasks if t is not None]
    for t in live:
        t.cancel()
    if not live:
        return
    await asyncio.wait(live)
    for t in live:
        if not t.cancelled() and (exc := t.exception()) is not None:
            log.warning("task %s ended with %r", t.get_name(), exc)
