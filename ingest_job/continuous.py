"""``kafscale ingest --continuous --trigger 30s``: micro-batches in one long-running job.

Each micro-batch is one ordinary run (:func:`ingest_job.job.run_ingest`) on the same
Spark session: it plans from the offsets in the tables, so it commits exactly once with
the offsets in the snapshot, resumes from the tables after a restart, and a concurrent
scheduled batch run cannot make it double-commit (whichever commits second finds the
offsets moved and drops its files). Micro-batches start every ``--trigger`` (the next one
right away when a batch took longer). After each it prints the freshness: the age of the
newest record committed so far. SIGTERM / SIGINT stop it after the current micro-batch.
docs/ingest.md, "Continuous mode".
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

from ingest_job.job import IngestConfig, run_ingest
from ingest_job.model import IngestError

log = logging.getLogger(__name__)

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "": 1.0}


def parse_trigger(text: str) -> float:
    """Seconds of a trigger like ``30s``, ``500ms``, ``2m`` or ``10``."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|)\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"bad trigger {text!r} (use e.g. 30s, 500ms, 2m)")
    return float(m.group(1)) * _UNITS[m.group(2)]


def run_continuous(
    cfg: IngestConfig,
    trigger_s: float,
    say: Callable[[str], None],
    stop: threading.Event,
    max_batches: int | None = None,
) -> int:
    """Run micro-batches until ``stop`` is set; returns how many ran."""
    from ingest_job.spark import get_spark

    spark = get_spark(cfg.master)
    newest_ms = committed_newest_ms(cfg)
    batch = 0
    while not stop.is_set() and (max_batches is None or batch < max_batches):
        batch += 1
        started = time.monotonic()
        try:
            summary = run_ingest(cfg, spark, lambda line: log.info("%s", line))
        except IngestError as exc:  # retried at the next trigger; reported each time
            say(f"micro-batch {batch} failed: {exc}")
        else:
            newest_ms = max(newest_ms, summary.run_newest_ms)
            for line in summary.lines():
                say(line)
            say(f"micro-batch {batch}: committed {summary.rows} rows; {_freshness(newest_ms)}")
        stop.wait(max(trigger_s - (time.monotonic() - started), 0.0))
    return batch


def committed_newest_ms(cfg: IngestConfig) -> int:
    """The newest record timestamp the tables' last commits carry (-1: none yet)."""
    from pyiceberg.exceptions import NoSuchTableError

    from ingest_job import catalog as cat
    from ingest_job.task import table_name_for

    try:
        catalog = cat.open_catalog(cfg.catalog, cfg.data_dir)
    except IngestError:
        return -1  # the first micro-batch reports the problem
    newest = -1
    for name in {cfg.table or table_name_for(t) for t in cfg.topics}:
        try:
            newest = max(newest, cat.table_newest_ms(catalog.load_table((cfg.namespace, name))))
        except NoSuchTableError:
            continue
    return newest


def _freshness(newest_ms: int) -> str:
    if newest_ms < 0:
        return "freshness: nothing committed by this job yet"
    age = max(time.time() - newest_ms / 1000, 0.0)
    return f"freshness: newest committed record is {age:.1f}s old"
