"""bench.broker_targets.Sampler: /metrics is not scraped while ``quiet()`` holds (the
paced phases), and is again after; RSS sampling goes on. A local HTTP server (127.0.0.1,
a free port) stands in for the broker's endpoint and counts the scrapes."""

from __future__ import annotations

import http.server
import os
import threading
import time
from collections.abc import Iterator

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
