"""Fault-injection checkpoints for deterministic fault tests (never enabled by default).

``KAFSCALE_FAULT_PAUSE=point[,point...]`` makes the broker stop itself with SIGSTOP the
first time it reaches each named checkpoint, after logging ``fault checkpoint <point>:
pausing (pid N)``. A test waits for the process to be stopped (``/proc/PID/stat`` state
``T``), drives the rest of the cluster (another broker takes over, commits, merges), then
resumes it with SIGCONT: the classic zombie (a GC pause, a stalled VM, a partition),
frozen at the exact point where it is most dangerous instead of wherever lucky timing
leaves it. The checkpoints are listed in docs/operations.md ("Fault tests").

Checkpoints sit just before every place that deletes or writes objects:

- ``flush.before_put``: a flush cycle, after building a segment, before its PUTs;
- ``cycle.before_commit``: a flush cycle committed as a cycle key (broker/fold.py),
  after its PUTs, before the transaction that acknowledges it;
- ``fold.before_commit``: the fold of cycle-key entries into partitions' own keys,
  before its transaction;
- ``sweep.before_list``: an unreferenced-object sweep, before it looks at anything;
- ``sweep.before_delete``: a sweep, after choosing its victims, before deleting them;
- ``retire.before_delete``: the delayed deletion of merged-away or expired objects,
  after the ownership check, before the delete;
- ``topic.before_list``: topic deletion, before listing the topic's objects;
- ``merge.before_commit``: a merge, after uploading the merged segment;
- ``compaction.before_commit``: a compaction pass, after uploading its rewritten
  segments, before the transaction that swaps them in.
- ``txn.after_prepare``: the transaction coordinator, after storing PrepareCommit or
  PrepareAbort, before it requests the markers;
- ``txn.after_markers_requested``: the coordinator, after putting the marker requests;
- ``txn.before_marker_commit``: a partition owner, after appending a control batch,
  before it is committed.
- ``txn.before_expire``: the coordinator, after finding a transactional id idle past
  ``transactional.id.expiration.ms``, before the compare-and-set that deletes it.

Two more freeze a broker where its membership changes (``broker.cluster``):

- ``start.before_serving``: a starting broker, registered and started, before its
  listeners accept connections (and before it marks its registration serving);
- ``stop.after_withdraw``: a stopping broker, after marking its registration not serving,
  before it closes its listeners and releases its partitions.
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger(__name__)

ENV = "KAFSCALE_FAULT_PAUSE"

POINTS = frozenset(
    {
        "flush.before_put",
        "cycle.before_commit",
        "fold.before_commit",
        "sweep.before_list",
        "sweep.before_delete",
        "retire.before_delete",
        "topic.before_list",
        "merge.before_commit",
        "compaction.before_commit",
        "txn.after_prepare",
        "txn.after_markers_requested",
        "txn.before_marker_commit",
        "txn.before_expire",
        "start.before_serving",
        "stop.after_withdraw",
    }
)

_armed: set[str] = set()


def arm_from_env() -> None:
    """Read ``KAFSCALE_FAULT_PAUSE`` (called once at broker start)."""
    _armed.clear()
    for point in os.environ.get(ENV, "").split(","):
        point = point.strip()
        if not point:
            continue
        if point not in POINTS:
            raise ValueError(f"{ENV}: unknown checkpoint {point!r} (known: {sorted(POINTS)})")
        _armed.add(point)
    if _armed:
        log.warning("fault checkpoints armed (test only): %s", ",".join(sorted(_armed)))


def checkpoint(point: str) -> None:
    """Stop this process (SIGSTOP) if ``point`` is armed; each point fires once."""
    if point in _armed:
        _armed.discard(point)
        log.warning("fault checkpoint %s: pausing (pid %d)", point, os.getpid())
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGSTOP)
        log.warning("fault checkpoint %s: resumed", point)
