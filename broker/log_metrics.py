"""Write-path, read-path, ownership and lease metrics (docs/operations.md, "Metrics").

``LogManager.metrics`` is a :class:`LogMetrics`; the flusher, the reader, the fetch
long poll, ownership changes and the lease keep-alive call it at their boundaries (one
call per flush cycle, segment, read or event, never per record). A ``LogManager`` built
without a broker (unit tests, tools) gets one over a private :class:`Telemetry`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from broker.telemetry import COUNT_BUCKETS, SIZE_BUCKETS, Family, Telemetry

if TYPE_CHECKING:
    from broker.partition import PendingBatch

_now = time.monotonic

#: seconds, 0.5 ms .. 2.5 s: fine enough to read a p99 of PUTs and commits off them
WAIT_BUCKETS = (
    0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0065, 0.008, 0.01, 0.0125, 0.015,
    0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5,
    0.75, 1.0, 2.5,
)  # fmt: skip

#: ownership loss reasons (``LogManager.drop``'s text -> label)
LOSS_REASONS = ("handoff", "fenced", "lease_expired", "unknown_outcome", "topic_deleted", "other")


def loss_reason(why: str) -> str:
    if "fenced" in why:
        return "fenced"
    if "lease" in why:
        return "lease_expired"
    if "unknown outcome" in why:
        return "unknown_outcome"
    return "other"


class LogMetrics:
    def __init__(self, telemetry: Telemetry | None = None) -> None:
        t = self.telemetry = telemetry or Telemetry()
        self.flush_cycle = t.histogram(
            "flush_cycle_duration_seconds",
            "Flush cycle duration: segment uploads plus the manifest commit.",
        ).child()
        # the two waits of a cycle between its start and its acknowledgements, finer than
        # the default buckets: the bench prints their p99 beside the paced p99
        self.segment_put = t.histogram(
            "segment_put_duration_seconds",
            "One segment object's conditional PUT (flush cycles).",
            (),
            WAIT_BUCKETS,
        ).child()
        self.flush_wait = t.histogram(
            "flush_wait_seconds",
            "How long a partition's oldest buffered batch waited for its flush cycle to start.",
            (),
            WAIT_BUCKETS,
        ).child()
        self.flush_commit = t.histogram(
            "flush_commit_duration_seconds",
            "One flush cycle's metadata transaction (per chunk), guards and resolution included.",
            (),
            WAIT_BUCKETS,
        ).child()
        # what else lies between a batch's arrival and its acknowledgement (docs/benchmarks.md,
        # "Round 4: paced p99"): the commit order and the event loop's lag
        self.flush_order_wait = t.histogram(
            "flush_order_wait_seconds",
            "How long a flush cycle, its uploads done, waited for the previous cycle's commit.",
            (),
            WAIT_BUCKETS,
        ).child()
        self.flush_timer_delay = t.histogram(
            "flush_timer_delay_seconds",
            "How late the flush-interval timer ran past its schedule (event-loop lag).",
            (),
            WAIT_BUCKETS,
        ).child()
        self.segment_bytes = t.histogram(
            "segment_size_bytes", "Sizes of the segments flushes write.", (), SIZE_BUCKETS
        ).child()
        self.segment_records = t.histogram(
            "segment_records", "Records per segment written by flushes.", (), COUNT_BUCKETS
        ).child()
        self.batch_bytes = t.histogram(
            "batch_size_bytes", "Sizes of the record batches producers send.", (), SIZE_BUCKETS
        ).child()
        self.batch_records = t.histogram(
            "batch_records", "Records per produced batch.", (), COUNT_BUCKETS
        ).child()
        self.bytes_in = t.counter(
            "topic_bytes_in", "Record-batch bytes committed to the log, per topic.", ("topic",)
        )
        self.records_in = t.counter(
            "topic_records_in", "Records committed to the log, per topic.", ("topic",)
        )
        self.bytes_out = t.counter(
            "topic_bytes_out", "Record-batch bytes served to Fetch requests, per topic.", ("topic",)
        )
        self.records_out = t.counter(
            "topic_records_out",
            "Offsets served to Fetch requests (records, counting compacted-away gaps), per topic.",
            ("topic",),
        )
        self.long_poll = t.histogram(
            "fetch_long_poll_wait_seconds",
            "Time a Fetch waited for data to arrive (per wait, up to its max_wait_ms).",
        ).child()
        self.acquired = t.counter(
            "ownership_acquisitions", "Partitions this broker took ownership of."
        )
        self.lost = t.counter(
            "ownership_losses",
            "Partitions this broker stopped owning, by reason (" + ", ".join(LOSS_REASONS) + ").",
            ("reason",),
        )
        self.keepalive = t.histogram(
            "lease_keepalive_delay_seconds",
            "How late the lease keep-alive woke up past its schedule (event-loop starvation).",
        ).child()
        self.acquired.inc((), 0)
        for reason in LOSS_REASONS:
            self.lost.inc((reason,), 0)
        self._topic_children: dict[str, tuple[Family, Family]] = {}
        #: monotonic time and delay of the keep-alive's last wake-up (``/healthz``)
        self.last_keepalive = (0.0, 0.0)

    # -- write path -----------------------------------------------------------------------
    def segment_written(
        self, topic: str, size: int, records: int, batches: Sequence[PendingBatch]
    ) -> None:
        self.segment_bytes.observe(size)
        self.segment_records.observe(records)
        nbytes = 0
        bb, br = self.batch_bytes, self.batch_records
        for p in batches:
            n = p.view.nbytes
            nbytes += n
            bb.observe(n)
            br.observe(p.header.record_count)
        self.bytes_in.inc((topic,), nbytes)
        self.records_in.inc((topic,), records)

    # -- read path ------------------------------------------------------------------------
    def served(self, topic: str, views: Sequence[memoryview], first: int, last: int) -> None:
        """``views`` (whole batches) were read for a Fetch: offsets ``first..last``."""
        if views:
            self.bytes_out.inc((topic,), sum(v.nbytes for v in views))
            self.records_out.inc((topic,), max(0, last - first + 1))

    # -- ownership and lease --------------------------------------------------------------
    def ownership_acquired(self) -> None:
        self.acquired.inc()

    def ownership_lost(self, reason: str) -> None:
        self.lost.inc((reason,))

    def keepalive_delay(self, delay: float) -> None:
        self.keepalive.observe(delay)
        self.last_keepalive = (_now(), delay)


def first_offset(view: memoryview) -> int:
    """The base offset of the first batch in ``view``."""
    return int.from_bytes(view[:8], "big", signed=True)
