"""``kafscale ingest`` and ``kafscale ingest maintain`` (README.md).

Every flag can also be given as an environment variable ``KAFSCALE_<FLAG>`` (upper case,
``-`` -> ``_``); a flag on the command line wins.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from broker.cli import EnvParser, run_guarded
from broker.logfmt import FORMATS, setup_logging
from ingest_job.model import IngestError

if TYPE_CHECKING:
    from ingest_job.job import IngestConfig

log = logging.getLogger(__name__)


def _common(pp: EnvParser) -> None:
    pp.option(
        "--store",
        "object store URL: file://DIR or s3://BUCKET/PREFIX?endpoint=URL&region=R",
        default="file://./data",
    )
    pp.option(
        "--meta", "metadata store: embedded or etcd://HOST:PORT[,HOST:PORT]", default="embedded"
    )
    pp.option(
        "--data-dir", "data directory (embedded metadata, embedded catalog)", default="./data"
    )
    pp.option("--meta-prefix", "metadata key prefix", default="/kafscale")
    pp.option(
        "--catalog", "pyiceberg catalog name (default: SQLite at DATA_DIR/iceberg/catalog.db)"
    )
    pp.option("--namespace", "Iceberg namespace of the tables", default="kafscale")


def ingest_parser() -> EnvParser:
    pp = EnvParser(
        "kafscale ingest", "Materialize committed KAFS segments as Iceberg tables, exactly once."
    )
    pp.option("--topics", "comma-separated topics to ingest")
    _common(pp)
    pp.option(
        "--segment-namespace",
        "namespace of the segment keys in the object store",
        default="default",
    )
    pp.switch("--table-per-topic", "one table per topic, named after it (the default)")
    pp.option("--table", "write every topic into this one table")
    pp.option("--route-by", "JSON field whose value routes a record to table BASE_VALUE")
    pp.option(
        "--value-format",
        "raw: value as bytes; json: also parse into columns; avro, protobuf, json-schema: "
        "typed columns from the schema registry (Confluent wire format)",
        default="raw",
        choices=["raw", "json", "avro", "protobuf", "json-schema"],
    )
    pp.option(
        "--key-format",
        "raw: key as bytes; avro, protobuf, json-schema: also key_<field> columns (subject "
        "<topic>-key)",
        default="raw",
        choices=["raw", "avro", "protobuf", "json-schema"],
    )
    pp.option(
        "--upsert-key",
        "comma-separated columns (or 'key', the record key): keep the newest row per key",
    )
    pp.option("--cdc", "unwrap change events: debezium (op c/u/r/d, before/after)",
              choices=["debezium"])  # fmt: skip
    pp.option(
        "--partition-by",
        "table partitioning on the record timestamp",
        default="day",
        choices=["day", "hour", "none"],
    )
    pp.option(
        "--max-records", "at most this many offsets per run (all partitions together)", type=int
    )
    pp.option("--master", "Spark master (default local[*], or what spark-submit gives)")
    pp.switch("--continuous", "run micro-batches every --trigger until SIGTERM / SIGINT")
    pp.option("--trigger", "micro-batch interval of --continuous (30s, 500ms, 2m)", default="30s")
    pp.option("--progress-interval", "seconds between progress lines", default="10", type=float)
    pp.option(
        "--unit-bytes", "segment bytes per Spark task", default=str(64 * 1024 * 1024), type=int
    )
    pp.option("--log-level", "logging level", default="INFO")
    pp.option("--log-format", "text or json (one object per line)", default="text", choices=FORMATS)
    pp.option(
        "--metrics-file",
        "write the run's metrics here as Prometheus text (node-exporter textfile collector)",
    )
    return pp


def maintain_parser() -> EnvParser:
    pp = EnvParser("kafscale ingest maintain", "Maintain the Iceberg tables the ingest job writes.")
    _common(pp)
    pp.option("--tables", "comma-separated tables (default: every table the job wrote)")
    pp.switch("--compact", "rewrite small data files into larger ones")
    pp.switch("--expire-snapshots", "expire snapshots older than --older-than-hours")
    pp.switch(
        "--remove-orphans", "delete files no snapshot references, older than --orphan-age-minutes"
    )
    pp.option("--older-than-hours", "snapshot age to expire", default="168", type=float)
    pp.option(
        "--orphan-age-minutes", "minimum age of a file removed as orphan", default="60", type=float
    )
    pp.option("--target-file-mb", "compaction target file size", default="128", type=float)
    pp.option("--log-level", "logging level", default="INFO")
    pp.option("--log-format", "text or json (one object per line)", default="text", choices=FORMATS)
    return pp


def _say(line: str) -> None:
    print(line, flush=True)


def _refused(args: argparse.Namespace) -> str | None:
    """What makes these flags unusable, checked before Spark starts (a store URL no store
    opens would otherwise fail inside every task), or None."""
    from broker.meta.base import check_meta_url
    from segments.store import check_store_url

    if not args.topics:
        return "--topics is required (or KAFSCALE_TOPICS)"
    if args.table and args.table_per_topic:
        return "--table and --table-per-topic exclude each other"
    try:
        check_store_url(args.store)
        check_meta_url(args.meta)
    except ValueError as exc:
        return str(exc)
    return None


def _ingest(argv: Sequence[str]) -> int:
    parser = ingest_parser()
    args = parser.parse_args(list(argv))
    setup_logging(args.log_level, args.log_format)
    parser.warn_unknown_env(log)
    refused = _refused(args)
    if refused:
        print(f"kafscale ingest: {refused}", file=sys.stderr)
        return 2
    from ingest_job.job import IngestConfig, run_ingest

    cfg = IngestConfig(
        topics=tuple(t.strip() for t in args.topics.split(",") if t.strip()),
        store_url=args.store,
        meta_url=args.meta,
        data_dir=args.data_dir,
        meta_prefix=args.meta_prefix,
        segment_namespace=args.segment_namespace,
        catalog=args.catalog,
        namespace=args.namespace,
        table=args.table,
        route_by=args.route_by,
        value_format=args.value_format,
        partition_by=args.partition_by,
        max_records=args.max_records,
        master=args.master,
        unit_bytes=args.unit_bytes,
        progress_interval=args.progress_interval,
        upsert_key=tuple(k.strip() for k in (args.upsert_key or "").split(",") if k.strip()),
        cdc=args.cdc,
        key_format=args.key_format,
    )
    if args.continuous:
        return _continuous(cfg, args.trigger)
    summary = run_ingest(cfg, say=_say)
    for line in summary.lines():
        _say(line)
    from ingest_job.report import json_line, write_metrics_file

    _say(json_line(summary))
    if args.metrics_file:
        write_metrics_file(summary, args.metrics_file)
    return 0


def _continuous(cfg: IngestConfig, trigger: str) -> int:
    """``--continuous``: micro-batches until SIGTERM / SIGINT (ingest_job/continuous.py)."""
    import signal
    import threading

    from ingest_job.continuous import parse_trigger, run_continuous

    try:
        trigger_s = parse_trigger(trigger)
    except ValueError as exc:
        print(f"kafscale ingest: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_a: stop.set())
    _say(f"continuous ingest: a micro-batch every {trigger_s:g}s")
    run_continuous(cfg, trigger_s, _say, stop)
    return 0


def _maintain(argv: Sequence[str]) -> int:
    parser = maintain_parser()
    args = parser.parse_args(list(argv))
    setup_logging(args.log_level, args.log_format)
    parser.warn_unknown_env(log)
    if not (args.compact or args.expire_snapshots or args.remove_orphans):
        print(
            "kafscale ingest maintain: give --compact, --expire-snapshots and/or --remove-orphans",
            file=sys.stderr,
        )
        return 2
    from ingest_job.maintain import MaintainConfig, run_maintain

    cfg = MaintainConfig(
        data_dir=args.data_dir,
        catalog=args.catalog,
        namespace=args.namespace,
        tables=tuple(t.strip() for t in args.tables.split(",")) if args.tables else (),
        compact=args.compact,
        expire_snapshots=args.expire_snapshots,
        remove_orphans=args.remove_orphans,
        older_than_hours=args.older_than_hours,
        orphan_age_minutes=args.orphan_age_minutes,
        target_file_bytes=int(args.target_file_mb * 1024 * 1024),
    )
    said = 0
    for line in run_maintain(cfg):
        _say(line)
        said += 1
    if not said:  # an empty namespace, or --tables naming none of the job's tables
        _say(f"no tables to maintain in namespace {cfg.namespace!r}")
    return 0


def _report(prog: str, func: Callable[[list[str]], int], argv: Sequence[str]) -> int:
    """Run one command: an IngestError (or a missing ingest extra) is one line, exit 1."""
    try:
        return run_guarded(prog, func, argv)
    except IngestError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
        log.debug("%s failed", prog, exc_info=True)
        return 1


def maintain_main(argv: list[str]) -> int:
    """Entry point of ``kafscale ingest maintain ...``; returns the process exit code."""
    return _report("kafscale ingest maintain", _maintain, argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``kafscale ingest ...`` (and ``... maintain``); returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "maintain":
        return maintain_main(args[1:])
    return _report("kafscale ingest", _ingest, args)
