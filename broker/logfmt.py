"""Log output for the ``kafscale`` commands: ``--log-format text`` (default) or ``json``.

Both carry the same fields: the time, the level, the logger's name and the message (with
the traceback, when there is one). The JSON form is one object per line for log shippers:
``{"time": "2026-01-02T03:04:05.678Z", "level": "INFO", "logger": "broker.server",
"message": "...", "exc": "Traceback ..."}`` (``exc`` only with a traceback).
docs/operations.md, "Logs", shows both.
"""

from __future__ import annotations

import json
import logging
import time

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, with the text format's fields."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": _utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False)


def _utc(created: float) -> str:
    ms = int(created * 1000) % 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{ms:03d}Z"


def setup_logging(level: str, fmt: str = "text") -> None:
    """Configure the root logger once for a command (``fmt``: one of :data:`FORMATS`)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler])
