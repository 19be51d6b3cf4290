"""Spark session set-up for the ingest job (driver side)."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"

JAVA_OPTIONS = "spark.driver.extraJavaOptions"
#: for a local-mode JVM this module starts (unless ``conf`` sets JAVA_OPTIONS): its JIT
#: stops at C1. The ingest job's JVM only schedules tasks (the data stays in the Python
#: workers), and C2's background compiling cost it ~0.5 s of CPU per 1M-record run
#: against ~0.1 s, CPU the workers share 2 cores with (docs/benchmarks.md, "Ingest").
LOCAL_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"


def local_java_options() -> str:
    """``LOCAL_JAVA_OPTIONS``, and the JVM's temporary directory where this process keeps
    its own (``TMPDIR``; Java otherwise uses ``/tmp`` whatever ``TMPDIR`` says). Spark's
    scratch directories (``spark.local.dir`` defaults to it) and the native libraries its
    codecs unpack then go there too. A path with white space is left out (Spark splits
    the options at white space)."""
    tmp = tempfile.gettempdir()
    if any(c.isspace() for c in tmp):
        return LOCAL_JAVA_OPTIONS
    return f"{LOCAL_JAVA_OPTIONS} -Djava.io.tmpdir={tmp}"


def _project_root() -> str:
    """The directory holding the ``ingest_job`` package (workers must import it)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def prepare_environment() -> None:
    """Workers run this interpreter and can import our packages (docs/ingest.md)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    root = _project_root()
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])


def get_spark(
    master: str | None = None,
    app_name: str = "kafscale-ingest",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """The active session, or a new one (``master`` and ``conf`` only apply to a new one)."""
    prepare_environment()
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    builder = SparkSession.builder.appName(app_name)
    settings = dict(conf or {})
    if "PYSPARK_GATEWAY_PORT" not in os.environ and (master or DEFAULT_MASTER).startswith("local"):
        settings.setdefault(JAVA_OPTIONS, local_java_options())  # a JVM we start here
    for key, value in settings.items():
        builder = builder.config(key, value)
    if master:
        builder = builder.master(master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit
        builder = builder.master(DEFAULT_MASTER)
    return (
        builder.config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.worker.reuse", "true")
        .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
        .getOrCreate()
    )
