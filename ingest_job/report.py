"""The ingest run's report: a JSON summary (printed on stdout as one line) and Prometheus
text (``--metrics-file``, written atomically for node-exporter's textfile collector or a
Pushgateway). docs/operations.md, "Ingest job", lists the metrics and their alerts.

Everything describes the run that just finished, as gauges: rows, files and Parquet bytes
committed per table; per table, topic and partition the table's committed offset and its
lag behind the committed log end (read from the manifest when the run planned); the
timestamp of the newest record in each table (freshness, from the Iceberg data files'
column statistics); and each phase's duration.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, write_to_textfile
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from ingest_job.job import IngestSummary

P = "kafscale_ingest_"

#: every metric name the metrics file can hold (the dashboard test checks against it)
EXPORTED = tuple(
    P + n
    for n in (
        "rows",
        "files",
        "bytes",
        "records_decoded",
        "segment_bytes_read",
        "dead_letters",
        "committed_offset",
        "log_end_offset",
        "lag_records",
        "newest_record_timestamp_seconds",
        "phase_duration_seconds",
        "run_duration_seconds",
        "last_success_timestamp_seconds",
    )
)


def newest_timestamp_ms(tbl: Table) -> int | None:
    """The newest ``timestamp`` in ``tbl`` (ms), from its data files' upper bounds."""
    if tbl.current_snapshot() is None:
        return None
    files = tbl.inspect.files()
    if "readable_metrics" not in files.column_names:
        return None
    newest: int | None = None
    for metrics in files.column("readable_metrics").to_pylist():
        bound = (metrics or {}).get("timestamp", {}) or {}
        upper = bound.get("upper_bound")
        if upper is not None:
            ms = int(upper.timestamp() * 1000)
            newest = ms if newest is None else max(newest, ms)
    return newest


def summary_json(summary: IngestSummary) -> dict[str, Any]:
    """The run summary as a JSON-able dict (``{"kafscale_ingest": {...}}`` on stdout)."""
    tables = {}
    for name, offs in sorted(summary.table_offsets.items()):
        rows, files, nbytes = summary.tables.get(name, (0, 0, 0))
        tables[name] = {
            "rows": rows,
            "files": files,
            "bytes": nbytes,
            "newest_record_timestamp_ms": summary.newest_ms.get(name),
            "partitions": [
                {
                    "topic": t,
                    "partition": p,
                    "committed_offset": off,
                    "log_end_offset": summary.log_ends.get((t, p), off),
                    "lag": max(0, summary.log_ends.get((t, p), off) - off),
                }
                for (t, p), off in sorted(offs.items())
            ],
        }
    return {
        "run_id": summary.run_id,
        "records": summary.records,
        "rows": summary.rows,
        "files": summary.files,
        "bytes": summary.bytes,
        "segments": summary.segments,
        "segment_bytes": summary.segment_bytes,
        "dead_letters": summary.dead_letters,
        "seconds": round(summary.seconds, 3),
        "phases": {k: round(v, 3) for k, v in summary.phases.items()},
        "finished_ms": summary.finished_ms,
        "tables": tables,
        "gaps": [str(g) for g in summary.gaps],
        "conflicts": list(summary.conflicts),
        "skipped": list(summary.skipped),
    }


class _RunCollector(Collector):
    def __init__(self, summary: IngestSummary) -> None:
        self.s = summary

    def collect(self) -> Iterator[Metric]:
        s = self.s
        per_table = [
            ("rows", "Rows the last run committed, per table.", 0),
            ("files", "Data files the last run committed, per table.", 1),
            ("bytes", "Parquet bytes the last run committed, per table.", 2),
        ]
        for name, help_, i in per_table:
            g = GaugeMetricFamily(P + name, help_, labels=["table"])
            for table in sorted(s.table_offsets):
                g.add_metric([table], s.tables.get(table, (0, 0, 0))[i])
            yield g
        for name, help_, value in (
            ("records_decoded", "Records the last run decoded.", s.records),
            ("segment_bytes_read", "Segment bytes the last run read.", s.segment_bytes),
            ("dead_letters", "Records the last run sent to dead-letter tables.", s.dead_letters),
            ("run_duration_seconds", "Duration of the last run.", s.seconds),
            ("last_success_timestamp_seconds", "When the last run finished.", s.finished_ms / 1e3),
        ):
            yield GaugeMetricFamily(P + name, help_, value=value)
        labels = ["table", "topic", "partition"]
        committed = GaugeMetricFamily(
            P + "committed_offset", "The table's committed (next) offset.", labels=labels
        )
        lag = GaugeMetricFamily(
            P + "lag_records",
            "Committed log end (when the run planned) minus the table's committed offset.",
            labels=labels,
        )
        ends = GaugeMetricFamily(
            P + "log_end_offset",
            "Committed log end of the partition when the run planned.",
            labels=["topic", "partition"],
        )
        for table, offs in sorted(s.table_offsets.items()):
            for (t, p), off in sorted(offs.items()):
                committed.add_metric([table, t, str(p)], off)
                lag.add_metric([table, t, str(p)], max(0, s.log_ends.get((t, p), off) - off))
        for (t, p), end in sorted(s.log_ends.items()):
            ends.add_metric([t, str(p)], end)
        yield committed
        yield lag
        yield ends
        fresh = GaugeMetricFamily(
            P + "newest_record_timestamp_seconds",
            "Timestamp of the newest record in the table (freshness: time() minus this).",
            labels=["table"],
        )
        for table, ms in sorted(s.newest_ms.items()):
            if ms is not None:
                fresh.add_metric([table], ms / 1e3)
        yield fresh
        phases = GaugeMetricFamily(
            P + "phase_duration_seconds",
            "Duration of each phase of the last run (plan, spark, commit).",
            labels=["phase"],
        )
        for phase, secs in s.phases.items():
            phases.add_metric([phase], secs)
        yield phases


def write_metrics_file(summary: IngestSummary, path: str) -> None:
    """Prometheus text for ``summary`` at ``path`` (written to a temporary file, renamed)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_RunCollector(summary))
    write_to_textfile(path, registry)


def json_line(summary: IngestSummary) -> str:
    return json.dumps({"kafscale_ingest": summary_json(summary)}, sort_keys=True)
