"""broker.logfmt: ``--log-format json`` has the text format's fields, one object a line."""

from __future__ import annotations

import json
import logging

from broker.logfmt import TEXT_FORMAT, JsonFormatter


def _record(msg: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            import sys

            exc_info = sys.exc_info()
    return logging.LogRecord("broker.x", logging.WARNING, __file__, 1, msg, args, exc_info)


def test_json_has_the_text_fields() -> None:
    rec = _record("closing %s: %d", "1.2.3.4:5", 7)
    line = JsonFormatter().format(rec)
    assert "\n" not in line
    obj = json.loads(line)
    assert obj["level"] == "WARNING" and obj["logger"] == "broker.x"
    assert obj["message"] == "closing 1.2.3.4:5: 7"
    assert obj["time"].endswith("Z") and "T" in obj["time"]
    text = logging.Formatter(TEXT_FORMAT).format(_record("closing %s: %d", "1.2.3.4:5", 7))
    assert text.endswith("WARNING broker.x: closing 1.2.3.4:5: 7")
    assert "exc" not in obj


def test_tracebacks_stay_on_one_line() -> None:
    line = JsonFormatter().format(_record("failed", exc=True))
    assert "\n" not in line
    obj = json.loads(line)
    assert obj["exc"].startswith("Traceback") and "ValueError: boom" in obj["exc"]


def test_every_command_takes_log_format() -> None:
    import pytest

    from broker.cli_broker import broker_parser
    from broker.cli_groups import _parser as groups_parser
    from broker.repair import _parser as truncate_parser
    from ingest_job.cli import ingest_parser, maintain_parser

    assert broker_parser().parse_args(["--log-format", "json"]).log_format == "json"
    assert groups_parser().parse_args(["--log-format", "json", "list"]).log_format == "json"
    argv = ["t", "0", "--to", "1", "--log-format", "json"]
    assert truncate_parser().parse_args(argv).log_format == "json"
    assert ingest_parser().parse_args(["--log-format", "json"]).log_format == "json"
    assert maintain_parser().parse_args([]).log_format == "text"
    with pytest.raises(SystemExit):
        ingest_parser().parse_args(["--log-format", "xml"])
