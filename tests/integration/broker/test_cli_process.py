"""The ``kafscale`` command in fresh interpreters: only the running command's module is
imported (``kafscale groups --help`` loads no Spark), a missing ingest extra is one line
naming what to install, and a ``KAFSCALE_*`` variable that is no setting is one warning."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.broker import start_broker

pytestmark = pytest.mark.integration


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter (so sys.modules shows what a command imported)."""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120
    )


LAZY = """
import contextlib, io, json, sys
from broker.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    main(sys.argv[1:] or {argv!r})
print(json.dumps(sorted(sys.modules)))
"""


@pytest.mark.parametrize(
    ("argv", "absent"),
    [
        (["groups", "--help"], ["pyspark", "pyiceberg", "pyarrow", "ingest_job", "broker.server"]),
        (["broker", "--help"], ["pyspark", "pyiceberg", "ingest_job", "kafka"]),
        (["segments", "inspect", "--help"], ["pyspark", "pyiceberg", "broker.server"]),
        (["ingest", "--help"], ["pyspark", "pyiceberg", "pyarrow", "broker.server"]),
        ([], ["pyspark", "pyiceberg", "ingest_job", "broker.server", "broker.cli_groups"]),
    ],
)
def test_only_the_running_command_is_imported(
    tmp_path: Path, argv: list[str], absent: list[str]
) -> None:
    proc = _python(LAZY.format(argv=argv), tmp_path)
    assert proc.returncode == 0, proc.stderr
    modules = json.loads(proc.stdout.strip().splitlines()[-1])
    loaded = [m for m in modules if any(m == a or m.startswith(a + ".") for a in absent)]
    assert loaded == []
    assert "broker.cli" in modules


MISSING = """
import sys
for name in ("pyspark", "pyiceberg", "pyarrow"):
    sys.modules[name] = None  # as if the ingest extras were not installed
from broker.cli import main
sys.exit(main({argv!r}))
"""


@pytest.mark.parametrize(
    "argv",
    [["ingest", "--topics", "t", "--data-dir", "d"], ["ingest", "maintain", "--compact"]],
)
def test_missing_ingest_extras_is_one_line(tmp_path: Path, argv: list[str]) -> None:
    proc = _python(MISSING.format(argv=argv), tmp_path)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("kafscale ingest")
    assert "is not installed; install the ingest extras: pip install 'kafscale[ingest]'" in lines[0]


def test_a_misspelt_variable_is_one_warning_and_the_broker_serves(tmp_path: Path) -> None:
    """``KAFSCALE_FLUSH_INTERVAL`` (the setting is ``..._MS``) is named in the log, once,
    and the broker starts and answers as usual."""
    b = start_broker(tmp_path / "b", env={"KAFSCALE_FLUSH_INTERVAL": "20"})
    try:
        with socket.create_connection(("127.0.0.1", b.port), timeout=30):
            pass
    finally:
        assert b.stop() == 0
    warned = [x for x in b.log_text().splitlines() if "KAFSCALE_FLUSH_INTERVAL" in x]
    assert len(warned) == 1, b.log_text()
    assert "is set but kafscale broker has no such setting: ignored" in warned[0]


def test_the_ingest_job_warns_of_a_misspelt_variable(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
    env["KAFSCALE_TOPIC"] = "orders"  # the setting is KAFSCALE_TOPICS
    proc = subprocess.run(
        [sys.executable, "-m", "broker.cli", "ingest"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "KAFSCALE_TOPIC is set but kafscale ingest has no such setting: ignored" in proc.stderr
    assert "--topics is required" in proc.stderr
