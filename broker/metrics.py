"""The broker's Prometheus metrics (``/metrics``), through prometheus-client.

Each broker has its own :class:`~prometheus_client.CollectorRegistry` (never the global
one: tests and benchmarks run several brokers in one process) holding one
:class:`BrokerCollector`. The collector reads the figures the broker already keeps
(``LogManager.stats``, ``Maintenance.stats``, the segment cache's counters, the in-flight
bytes, ...) at scrape time, so nothing on the produce/fetch path changes.

Names: ``kafscale_`` prefix, counters end in ``_total``; every family has a HELP line.
A stats key a later change adds to ``LogManager.stats`` or ``Maintenance.stats`` is
exported too (with a generic HELP line) until it gets an entry in the tables below.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector, CollectorRegistry

from broker import compaction_metrics

if TYPE_CHECKING:
    from broker.server import Broker

PREFIX = "kafscale_"

#: gauge name (without prefix) -> (HELP, how to read it from the broker)
GAUGES: dict[str, tuple[str, Callable[[Broker], float]]] = {
    "connections": (
        "Open Kafka client connections.",
        lambda b: len(b.connections),
    ),
    "inflight_bytes": (
        "Request bytes read and not yet answered, over all connections.",
        lambda b: b.admission.inflight,
    ),
    "pending_bytes": (
        "Bytes appended on this broker and not yet committed to the object store.",
        lambda b: b.logs.pending_bytes,
    ),
    "partitions_owned": (
        "Partitions this broker owns (has acquired) right now.",
        lambda b: len(b.logs.logs),
    ),
    "producer_ids": (
        "Idempotent producers tracked over the partitions this broker owns.",
        lambda b: sum(len(lg.producers) for lg in b.logs.logs.values()),
    ),
    "topics": (
        "Topics in the cluster's metadata.",
        lambda b: len(b.topics.all()),
    ),
    "live_brokers": (
        "Brokers registered (holding a live lease) in the cluster.",
        lambda b: len(b.cluster.brokers()),
    ),
    "segment_cache_bytes": (
        "Bytes held by the segment cache.",
        lambda b: b.logs.cache.bytes,
    ),
    "admission_paused_connections": (
        "Connections not being read because of in-flight limits (admission control).",
        lambda b: sum(1 for c in b.connections if c.paused),
    ),
    "admission_held_bytes": (
        "Unanswered request bytes of connections paused by admission control.",
        lambda b: sum(int(getattr(c, "inflight", 0)) for c in b.connections if c.paused),
    ),
    "admission_frame_bytes": (
        "Announced bytes of partially received frames reserved (--queued-max-request-bytes).",
        lambda b: b.admission.frame_bytes,
    ),
}

#: counter name (without prefix and ``_total``) -> (HELP, how to read it)
CACHE_COUNTERS: dict[str, tuple[str, Callable[[Broker], float]]] = {
    "segment_cache_hits": (
        "Segment reads served from the segment cache.",
        lambda b: b.logs.cache.hits,
    ),
    "segment_cache_misses": (
        "Segment reads the segment cache could not serve.",
        lambda b: b.logs.cache.misses,
    ),
    "segment_cache_evictions": (
        "Segments evicted from the segment cache to stay within --cache-bytes.",
        lambda b: b.logs.cache.evictions,
    ),
}

#: ``LogManager.stats`` key -> (counter name without prefix and ``_total``, HELP)
LOG_COUNTERS: dict[str, tuple[str, str]] = {
    "flush_cycles": ("flush_cycles", "Flush cycles run (each uploads and commits a batch)."),
    "segments": ("segments", "Segments written to the object store by flushes."),
    "segment_bytes": ("segment_bytes", "Bytes of the segments written by flushes."),
    "txns": ("txns", "Metadata transactions committed by flushes."),
    "shared_objects": (
        "shared_objects",
        "Shared objects written by flushes, each holding many partitions' segments.",
    ),
    "shared_segments": (
        "shared_segments",
        "Segments written inside shared objects (also counted in kafscale_segments_total).",
    ),
}

#: ``SharedSweeper.stats`` key -> (counter name without prefix and ``_total``, HELP)
SHARED_SWEEP_COUNTERS: dict[str, tuple[str, str]] = {
    "shared_passes": ("shared_sweep_passes", "Passes of the shared sweep (controller only)."),
    "shared_deleted": (
        "shared_objects_deleted",
        "Shared objects deleted once no manifest entry names or can name any segment in them.",
    ),
}

#: ``Folder.stats`` key -> (counter name without prefix and ``_total``, HELP)
FOLD_COUNTERS: dict[str, tuple[str, str]] = {
    "cycle_txns": ("cycle_txns", "Flush cycles committed as one cycle key (broker/fold.py)."),
    "fold_txns": ("fold_txns", "Metadata transactions folding cycle-key entries."),
    "folds": ("folds", "Folds of cycle-key entries into the partitions' own keys."),
    "folded_segments": ("folded_segments", "Segments folded from cycle keys."),
    "keys_deleted": ("cycle_keys_deleted", "Cycle keys deleted once folded or settled."),
    "aborted": ("cycle_aborted", "Cycle commits of unknown outcome settled by a tombstone."),
}

#: ``Maintenance.stats`` key -> (counter name without prefix and ``_total``, HELP)
MAINTENANCE_COUNTERS: dict[str, tuple[str, str]] = {
    "merges": ("maintenance_merges", "Runs of small segments merged into one segment."),
    "merged_segments": (
        "maintenance_merged_segments",
        "Small segments replaced by merged segments.",
    ),
    "merged_bytes": (
        "maintenance_merged_bytes",
        "Bytes of the segments merges wrote (against kafscale_topic_bytes_in_total: how "
        "often merges rewrite what was produced).",
    ),
    "dropped_segments": (
        "maintenance_dropped_segments",
        "Segments dropped from manifests by retention or DeleteRecords.",
    ),
    "deleted": (
        "maintenance_deleted_objects",
        "Replaced or expired segment objects deleted after the grace period.",
    ),
    "reclaimed_bytes": (
        "maintenance_reclaimed_bytes",
        "Bytes of the segments dropped by retention or DeleteRecords (deleted after the grace).",
    ),
    "failures": (
        "maintenance_failures",
        "Per-partition maintenance failures (logged once per cause, retried with back-off).",
    ),
    "expired_producers": (
        "maintenance_expired_producer_ids",
        "Idempotent producers forgotten by a partition after --producer-id-expiration-ms idle.",
    ),
    "merge_plans": (
        "maintenance_merge_plans",
        "Partitions looked at for small segments to merge (one with no change since its "
        "last look and no segment come of age is skipped).",
    ),
}


#: durability counters: ``Committer.stats``, ``ObjectDeleter.stats``, ``Cluster.stats``
#: (key -> (counter name without prefix and ``_total``, HELP))
COMMIT_COUNTERS: dict[str, tuple[str, str]] = {
    "ambiguous": (
        "commits_unknown_outcome",
        "Manifest commits the metadata store could not confirm (then resolved by read-back).",
    ),
    "resolved": ("commits_resolved", "Commits of unknown outcome settled by a read-back."),
    "unresolved": (
        "commits_unresolved",
        "Commits whose outcome stayed unknown (producers failed retriably, nothing deleted).",
    ),
}
DELETER_COUNTERS: dict[str, tuple[str, str]] = {
    "deleted": ("objects_retired_deleted", "Retired segment objects deleted by their owner."),
    "swept": ("objects_swept", "Unreferenced objects of earlier writers deleted by sweeps."),
}
CLUSTER_COUNTERS: dict[str, tuple[str, str]] = {
    "lease_refreshes": ("lease_refreshes", "Successful refreshes of this broker's lease."),
    "lease_losses": (
        "lease_losses",
        "Times this broker found its lease expired (it dropped everything, then re-registered).",
    ),
}


def _counters(
    stats: Mapping[str, float], table: Mapping[str, tuple[str, str]], prefix: str, source: str
) -> Iterator[Metric]:
    for key, value in sorted(stats.items()):
        name, help_ = table.get(key, (prefix + key, f"{source}[{key!r}]."))
        family = CounterMetricFamily(PREFIX + name, help_)
        family.add_metric([], value)
        yield family


class BrokerCollector(Collector):
    """Reads one broker's live figures at every scrape."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        b = self.broker
        for name, (help_, read) in GAUGES.items():
            yield GaugeMetricFamily(PREFIX + name, help_, value=read(b))
        for name, (help_, read) in CACHE_COUNTERS.items():
            yield CounterMetricFamily(PREFIX + name, help_, value=read(b))
        yield from _counters(b.logs.stats, LOG_COUNTERS, "", "LogManager.stats")
        yield from _counters(
            b.logs.shared_sweep.stats, SHARED_SWEEP_COUNTERS, "", "SharedSweeper.stats"
        )
        yield from _counters(b.logs.folder.stats, FOLD_COUNTERS, "", "Folder.stats")
        maintenance = b.logs.maintenance
        if maintenance is not None:
            yield from _counters(
                maintenance.stats, MAINTENANCE_COUNTERS, "maintenance_", "Maintenance.stats"
            )
            yield from _counters(maintenance.deleter.stats, DELETER_COUNTERS, "", "deleter")
            compactor = getattr(maintenance, "compactor", None)
            if compactor is not None:
                yield from compaction_metrics.collect(compactor)
        yield from _counters(b.logs.committer.stats, COMMIT_COUNTERS, "", "Committer.stats")
        counts = {k: v for k, v in b.cluster.stats.items() if k in CLUSTER_COUNTERS}
        yield from _counters(counts, CLUSTER_COUNTERS, "", "Cluster.stats")
        yield GaugeMetricFamily(
            PREFIX + "lease_refresh_gap_max_seconds",
            "Longest time between two lease refresh attempts since start (keep-alive delay).",
            value=b.cluster.stats["max_refresh_gap_s"],
        )


def broker_registry(broker: Broker) -> CollectorRegistry:
    """A registry of its own for ``broker`` (not prometheus-client's global one): the
    figures read at scrape time, the event metrics (``broker.telemetry``: requests, stores,
    write/read paths, ownership) and the consumer groups (``broker.group_metrics``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(broker))
    registry.register(broker.telemetry)
    registry.register(broker.group_metrics)
    return registry


#: samples rendered between two turns of the event loop in :func:`exposition_async`
#: (~7 us each: a chunk holds the loop for about 1.5 ms)
CHUNK_SAMPLES = 200
_OPENMETRICS = "application/openmetrics-text"
_MOVED_TO_THE_END = ("_created", "_gsum", "_gcount")


def exposition(registry: Collector, accept: str | None) -> tuple[bytes, str]:
    """The scrape body and its content type, in the format the ``Accept`` header asks for
    (Prometheus text, or OpenMetrics), in one piece."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type


async def exposition_async(registry: Collector, accept: str | None) -> tuple[bytes, str]:
    """The same body as :func:`exposition`, rendered ``CHUNK_SAMPLES`` samples at a time
    with a turn of the event loop between two chunks: in one piece, a broker with a few
    thousand series (histograms per API and version, lag per partition) held its loop
    for ~16 ms per scrape, and every produce waiting on it with it (docs/benchmarks.md,
    "Round 21"). A family larger than a chunk is cut between its samples, its HELP/TYPE
    lines kept on the first piece only. Families are collected as the rendering goes
    (each one a consistent snapshot of itself, as in one piece)."""
    encoder, content_type = choose_encoder(accept or "")
    eof = b"# EOF\n" if content_type.startswith(_OPENMETRICS) else b""
    parts: list[bytes] = []
    batch: list[Metric] = []
    size = 0
    for metric in registry.collect():
        for piece, first in _pieces(metric):
            if first:
                batch.append(piece)
                size += len(piece.samples)
                if size < CHUNK_SAMPLES:
                    continue
                parts.append(_render(encoder, batch, eof))
                batch, size = [], 0
            else:  # follows its family's first piece, which filled the chunk just written
                parts.append(_render(encoder, [piece], eof, headers=False))
            await asyncio.sleep(0)
    parts.append(_render(encoder, batch, eof))
    parts.append(eof)
    return b"".join(parts), content_type


def _pieces(metric: Metric) -> Iterator[tuple[Metric, bool]]:
    """``metric`` in pieces of at most ``CHUNK_SAMPLES`` samples, each with whether it is
    the family's first. A family with OpenMetrics-only samples (``_created``, ``_gsum``,
    ``_gcount``; none of this broker's) is not cut: the Prometheus text encoder moves
    them to the end of their family, which would then be the end of each piece."""
    samples = metric.samples
    extras = {metric.name + suffix for suffix in _MOVED_TO_THE_END}
    if len(samples) <= CHUNK_SAMPLES or any(s.name in extras for s in samples):
        yield metric, True
        return
    for start in range(0, len(samples), CHUNK_SAMPLES):
        piece = copy.copy(metric)
        piece.samples = samples[start : start + CHUNK_SAMPLES]
        yield piece, start == 0


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def _render(
    encoder: Callable[[Collector], bytes], families: list[Metric], eof: bytes, headers: bool = True
) -> bytes:
    """``families`` in the encoder's format, without its closing ``# EOF`` (written once
    at the end); ``headers=False``: a cut family's continuation, its HELP/TYPE lines left
    out."""
    if not families:
        return b""
    body = encoder(_Families(families))
    if eof and body.endswith(eof):
        body = body[: -len(eof)]
    if not headers:
        while body.startswith(b"# "):
            body = body[body.index(b"\n") + 1 :]
    return body
