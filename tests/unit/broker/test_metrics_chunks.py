"""broker.metrics.exposition_async: the scrape body rendered a chunk at a time, with the
event loop run between chunks, is byte for byte the body rendered in one piece, in both
formats; a family added while it renders does not break it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

from broker.metrics import CHUNK_SAMPLES, exposition, exposition_async
from broker.telemetry import Telemetry
from tests.unit.broker.loop_turns import counting_turns

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


class _Created(Collector):
    """A counter with a ``_created`` sample per series (the text encoder moves those to
    the end of the family, so it must not be cut)."""

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("kafscale_created_things", "Things.", labels=["n"])
        for n in range(CHUNK_SAMPLES):
            family.add_metric([str(n)], n, created=1_700_000_000.0 + n)
        yield family


def _registry() -> tuple[CollectorRegistry, Telemetry, int]:
    """A registry like a busy broker's: a histogram of 40 series (~900 samples, cut), a
    gauge of 1,000 series (cut into five), small counters between them, a counter with
    ``_created`` samples (not cut). Returns the registry, its telemetry, the samples."""
    tel = Telemetry()
    hist = tel.histogram("request_duration_seconds", "Latency.", labels=["api", "version"])
    for i in range(40):
        for v in range(i + 1):
            hist.observe((f"api{i}", str(i % 7)), 0.0005 * v)
    tel.counter("small", "A small counter.", labels=["x"]).inc(("a",), 3)
    lag = tel.gauge("group_lag", "Lag.", labels=["group", "topic", "partition"])
    for p in range(1000):
        lag.set(("g", "orders", str(p)), float(p * 3))
    tel.counter("other", "Another.").inc((), 1)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(tel)
    registry.register(_Created())
    samples = sum(len(m.samples) for m in registry.collect())
    return registry, tel, samples


@pytest.mark.parametrize("accept", [None, OPENMETRICS])
async def test_the_chunked_body_is_the_body_in_one_piece(accept: str | None) -> None:
    registry, _tel, samples = _registry()
    assert samples > 8 * CHUNK_SAMPLES  # several cut families and several chunks
    whole, whole_type = exposition(registry, accept)
    chunked, chunked_type = await exposition_async(registry, accept)
    assert chunked_type == whole_type
    assert chunked == whole
    text = chunked.decode()
    if accept is None:
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert len(families["kafscale_group_lag"].samples) == 1000
    else:
        assert text.count("# EOF\n") == 1 and text.endswith("# EOF\n")
        families = {f.name: f for f in openmetrics_families(text)}
        assert len(families["kafscale_group_lag"].samples) == 1000
    assert text.count("# HELP kafscale_group_lag ") == 1


async def test_the_event_loop_runs_between_chunks() -> None:
    registry, _tel, samples = _registry()
    with counting_turns() as turns:
        await exposition_async(registry, None)
    # one turn at least per full chunk of samples (a family is cut to fill them)
    assert turns.count >= samples // CHUNK_SAMPLES - 1


async def test_a_family_added_while_it_renders_does_not_break_the_scrape() -> None:
    registry, tel, _samples = _registry()
    loop = asyncio.get_running_loop()
    loop.call_soon(lambda: tel.gauge("late", "Added mid-scrape.").set((), 1.0))
    body, _ = await exposition_async(registry, None)
    assert b"# HELP kafscale_group_lag " in body
    assert b"kafscale_late" in (await exposition_async(registry, None))[0]  # the next one
