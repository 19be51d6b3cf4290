"""``kafscale ingest`` and ``kafscale ingest maintain`` (DESIGN §10).

Every flag can also be given as an environment variable ``KAFSCALE_<FLAG>`` (upper case,
``-`` -> ``_``); a flag on the command line wins.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from ingest_job.model import IngestError

log = logging.getLogger(__name__)

_TRUE = {"1", "true", "yes", "on"}


def _env(flag: str) -> str | None:
    return os.environ.get("KAFSCALE_" + flag.lstrip("-").upper().replace("-", "_"))


class _Parser:
    """argparse with KAFSCALE_* defaults documented in --help."""

    def __init__(self, prog: str, description: str) -> None:
        self.p = argparse.ArgumentParser(prog=prog, description=description)

    def opt(self, flag: str, default: str | None, help_: str, **kw: Any) -> None:
        env = "KAFSCALE_" + flag.lstrip("-").upper().replace("-", "_")
        val = _env(flag)
        self.p.add_argument(
            flag, default=val if val is not None else default, help=f"{help_} (env {env})", **kw
        )

    def flag(self, flag: str, help_: str) -> None:
        env = "KAFSCALE_" + flag.lstrip("-").upper().replace("-", "_")
        val = (_env(flag) or "").lower() in _TRUE
        self.p.add_argument(flag, action="store_true", default=val, help=f"{help_} (env {env})")


def _common(pp: _Parser) -> None:
    pp.opt(
        "--store",
        "file://./data",
        "object store URL: file://DIR or s3://BUCKET/PREFIX?endpoint=URL&region=R",
    )
    pp.opt("--meta", "embedded", "metadata store: embedded or etcd://HOST:PORT[,HOST:PORT]")
    pp.opt("--data-dir", "./data", "data directory (embedded metadata, embedded catalog)")
    pp.opt("--meta-prefix", "/kafscale", "metadata key prefix")
    pp.opt(
        "--catalog", None, "pyiceberg catalog name (default: SQLite at DATA_DIR/iceberg/catalog.db)"
    )
    pp.opt("--namespace", "kafscale", "Iceberg namespace of the tables")


def ingest_parser() -> argparse.ArgumentParser:
    pp = _Parser(
        "kafscale ingest", "Materialize committed KAFS segments as Iceberg tables, exactly once."
    )
    pp.opt("--topics", None, "comma-separated topics to ingest")
    _common(pp)
    pp.opt("--segment-namespace", "default", "namespace of the segment keys in the object store")
    pp.flag("--table-per-topic", "one table per topic, named after it (the default)")
    pp.opt("--table", None, "write every topic into this one table")
    pp.opt("--route-by", None, "JSON field whose value routes a record to table BASE_VALUE")
    pp.opt(
        "--value-format",
        "raw",
        "raw: value as bytes; json: also parse into columns",
        choices=["raw", "json"],
    )
    pp.opt(
        "--partition-by",
        "day",
        "table partitioning on the record timestamp",
        choices=["day", "hour", "none"],
    )
    pp.opt(
        "--max-records",
        None,
        "at most this many offsets per run (all partitions together)",
        type=int,
    )
    pp.opt("--master", None, "Spark master (default local[*], or what spark-submit gives)")
    pp.opt("--progress-interval", "10", "seconds between progress lines", type=float)
    pp.opt("--unit-bytes", str(64 * 1024 * 1024), "segment bytes per Spark task", type=int)
    pp.opt("--log-level", "INFO", "logging level")
    return pp.p


def maintain_parser() -> argparse.ArgumentParser:
    pp = _Parser("kafscale ingest maintain", "Maintain the Iceberg tables the ingest job writes.")
    _common(pp)
    pp.opt("--tables", None, "comma-separated tables (default: every table the job wrote)")
    pp.flag("--compact", "rewrite small data files into larger ones")
    pp.flag("--expire-snapshots", "expire snapshots older than --older-than-hours")
    pp.flag(
        "--remove-orphans", "delete files no snapshot references, older than --orphan-age-minutes"
    )
    pp.opt("--older-than-hours", "168", "snapshot age to expire", type=float)
    pp.opt("--orphan-age-minutes", "60", "minimum age of a file removed as orphan", type=float)
    pp.opt("--target-file-mb", "128", "compaction target file size", type=float)
    pp.opt("--log-level", "INFO", "logging level")
    return pp.p


def _say(line: str) -> None:
    print(line, flush=True)


def _ingest(argv: Sequence[str]) -> int:
    args = ingest_parser().parse_args(list(argv))
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not args.topics:
        print("kafscale ingest: --topics is required (or KAFSCALE_TOPICS)", file=sys.stderr)
        return 2
    if args.table and args.table_per_topic:
        print("kafscale ingest: --table and --table-per-topic exclude each other", file=sys.stderr)
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
    )
    summary = run_ingest(cfg, say=_say)
    for line in summary.lines():
        _say(line)
    return 0


def _maintain(argv: Sequence[str]) -> int:
    args = maintain_parser().parse_args(list(argv))
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
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
    for line in run_maintain(cfg):
        _say(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``kafscale ingest ...``; returns the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args and args[0] == "maintain":
            return _maintain(args[1:])
        return _ingest(args)
    except IngestError as exc:
        print(f"kafscale ingest: error: {exc}", file=sys.stderr, flush=True)
        log.debug("ingest failed", exc_info=True)
        return 1
