"""bench.broker_targets.Sampler: /metrics is not scraped while ``quiet()`` holds (the
paced phases), and is again after; RSS sampling goes on. A local HTTP server (127.0.0.1,
a free port) stands in for the broker's endpoint and counts the scrapes. And
``py_spy``: found, or named in one line."""

from __future__ import annotations

import http.server
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.broker_targets import Sampler


class _Metrics(http.server.BaseHTTPRequestHandler):
    hits = 0
    scraped = threading.Event()

    def do_GET(self) -> None:  # noqa: N802 - the http.server name
        body = b"kafscale_inflight_bytes 42.0\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        type(self).hits += 1
        type(self).scraped.set()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def metrics_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_no_scrape_starts_while_quiet_and_scrapes_resume_after(metrics_url: str) -> None:
    sampler = Sampler(os.getpid(), metrics_url).start()
    try:
        assert _Metrics.scraped.wait(30)  # scraping, as before
        with sampler.quiet():
            started = sampler.scrapes
            time.sleep(1.5)  # three scrape periods: none may start
            assert sampler.scrapes == started
        _Metrics.scraped.clear()
        assert _Metrics.scraped.wait(30)  # and again once the block ends
    finally:
        sampler.stop()
    assert sampler.peaks["kafscale_inflight_bytes"] == 42.0  # what the scrapes read
    assert sampler.max_rss > 0


def test_py_spy_is_found_beside_the_interpreter_or_named_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """py-spy is in the bench extra, but a virtualenv without it (the extra left out)
    ends a run asked to profile with one line naming what to install, before any broker
    starts."""
    from bench import broker_targets

    monkeypatch.setattr(broker_targets.shutil, "which", lambda _name: None)
    monkeypatch.setattr(broker_targets.sys, "executable", str(tmp_path / "python"))
    with pytest.raises(SystemExit, match="^py-spy not found: pip install py-spy"):
        broker_targets.py_spy()
    (tmp_path / "py-spy").write_text("")
    assert broker_targets.py_spy() == str(tmp_path / "py-spy")
