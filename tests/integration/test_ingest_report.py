"""``kafscale ingest --metrics-file``: one real run on Spark local[2] (the fixtures of
test_ingest.py), capped by ``--max-records`` so that it leaves lag behind. The metrics
file parses with prometheus-client's parser; its lag equals the log end minus the offset
the table committed, its freshness equals the newest timestamp in the table read back,
and the JSON summary on stdout says the same (issue 11)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ingest_job import cli
from ingest_job.report import EXPORTED
from tests.integration.test_ingest import _table_rows, env, spark  # noqa: F401 (fixtures)
from tests.unit.ingest_job.conftest import KafsEnv
from tests.unit.ingest_job.segdata import values_for

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.integration, pytest.mark.spark]

PER_PARTITION = 50
CAP = 60  # of 2 x 50 offsets: 30 per partition this run, 20 left behind on each


async def test_metrics_file_lag_and_freshness_match_table_and_log_ends(
    spark: SparkSession,  # noqa: F811
    env: KafsEnv,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    writers = await env.topic("orders", 2)
    for w in writers:
        await w.append(values_for("orders", w.partition, 0, PER_PARTITION))
    metrics = tmp_path / "ingest.prom"
    argv = [
        "--topics", "orders",
        "--store", env.store_url,
        "--data-dir", str(env.data_dir),
        "--master", "local[2]",
        "--max-records", str(CAP),
        "--metrics-file", str(metrics),
        "--log-format", "json",
    ]  # fmt: skip
    assert await asyncio.to_thread(cli.main, argv) == 0
    out = capsys.readouterr().out.splitlines()
    summary = json.loads(out[-1])["kafscale_ingest"]

    rows = _table_rows(env, "orders")
    assert len(rows) == CAP
    table = "kafscale.orders"
    m = {}
    families = list(text_string_to_metric_families(metrics.read_text()))
    assert {f.name for f in families} == set(EXPORTED)  # what the dashboard test trusts
    for fam in families:
        for s in fam.samples:
            m[(s.name, tuple(sorted(s.labels.items())))] = s.value
    for w in writers:
        p = w.partition
        in_table = [r.offset for r in rows if r.partition == p]
        committed = max(in_table) + 1
        labels = (("partition", str(p)), ("table", table), ("topic", "orders"))
        assert m[("kafscale_ingest_committed_offset", labels)] == committed
        end = m[("kafscale_ingest_log_end_offset", (("partition", str(p)), ("topic", "orders")))]
        assert end == w.next_offset == PER_PARTITION
        lag = m[("kafscale_ingest_lag_records", labels)]
        assert lag == w.next_offset - committed > 0
        (part,) = [x for x in summary["tables"][table]["partitions"] if x["partition"] == p]
        assert (part["committed_offset"], part["lag"]) == (committed, lag)
    newest_ms = max(r.timestamp for r in rows)
    fresh = m[("kafscale_ingest_newest_record_timestamp_seconds", (("table", table),))]
    assert fresh == newest_ms / 1000
    assert summary["tables"][table]["newest_record_timestamp_ms"] == newest_ms
    assert m[("kafscale_ingest_rows", (("table", table),))] == CAP == summary["rows"]
    assert m[("kafscale_ingest_bytes", (("table", table),))] > 0
    for phase in ("plan", "spark", "commit"):
        assert m[("kafscale_ingest_phase_duration_seconds", (("phase", phase),))] >= 0
        assert phase in summary["phases"]
