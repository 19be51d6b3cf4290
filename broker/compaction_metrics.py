"""The compactor's Prometheus families (docs/operations.md, "Log compaction"), read at
scrape time from ``Compactor.stats`` and ``Compactor.gauges`` by ``broker.metrics``."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from broker.compaction import Compactor

PREFIX = "kafscale_compaction_"

#: ``Compactor.stats`` key -> (counter name without prefix and ``_total``, HELP)
COUNTERS: dict[str, tuple[str, str]] = {
    "passes": ("passes", "Compaction passes that swapped rewritten segments in."),
    "bytes_read": ("bytes_read", "Segment bytes read by compaction (key map and rewrite)."),
    "bytes_written": ("bytes_written", "Bytes of the compacted segments written."),
    "records_removed": ("records_removed", "Records compaction removed (superseded or expired)."),
    "segments_replaced": ("segments_replaced", "Segments replaced by compacted ones."),
    "bytes_compacted": (
        "bytes_compacted",
        "Bytes of the segments replaced by compacted ones (the log compacted).",
    ),
}


def collect(compactor: Compactor) -> Iterator[Metric]:
    for key, value in sorted(compactor.stats.items()):
        name, help_ = COUNTERS.get(key, (key, f"Compactor.stats[{key!r}]."))
        yield CounterMetricFamily(PREFIX + name, help_, value=value)
    ratio = GaugeMetricFamily(
        PREFIX + "dirty_ratio",
        "Share of a compacted partition's cleanable bytes not yet compacted.",
        labels=["topic", "partition"],
    )
    age = GaugeMetricFamily(
        PREFIX + "oldest_cleanable_age_seconds",
        "Age of the oldest cleanable record not yet compacted (0: none).",
        labels=["topic", "partition"],
    )
    for (topic, partition), (r, age_ms) in sorted(compactor.gauges.items()):
        ratio.add_metric([topic, str(partition)], r)
        age.add_metric([topic, str(partition)], age_ms / 1000)
    yield ratio
    yield age
