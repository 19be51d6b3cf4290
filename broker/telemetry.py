"""Cheap event metrics for the broker's hot paths, exported through prometheus-client.

The request, store and ownership recorders (``broker.request_metrics``,
``broker.instrumented``) observe events many thousand times a second on the event loop.
prometheus-client's own ``Histogram`` takes a lock and looks labels up on every call;
these primitives do neither (everything runs on the one event-loop thread): an
observation is a ``bisect`` and two additions into a per-label-set child the caller keeps.
A :class:`Telemetry` collector turns them into ordinary metric families at scrape time.

Every family is listed, with its meaning and the alert worth setting, in
docs/operations.md ("Metrics").
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

PREFIX = "kafscale_"

#: seconds: from 100 µs (an in-memory answer) to 30 s (a long poll, a stalled store)
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
#: bytes: 64 B .. 64 MiB, by powers of four
SIZE_BUCKETS = tuple(float(64 * 4**i) for i in range(11))
#: record counts per batch or segment
COUNT_BUCKETS = (1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0)


class Hist:
    """One histogram child: per-bucket counts (``le`` inclusive) plus sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last slot is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


class Family:
    """A labelled metric: ``child(*labels)`` for histograms, ``inc(labels, n)`` for
    counters, ``set(labels, v)`` for gauges."""

    def __init__(
        self,
        kind: str,
        name: str,
        help_: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> None:
        self.kind = kind
        self.name = PREFIX + name
        self.help = help_
        self.labels = tuple(labels)
        self.buckets = tuple(buckets)
        self.children: dict[tuple[str, ...], Hist] = {}
        self.values: dict[tuple[str, ...], float] = {}
        # called before each collect: a recorder that counts in a cheaper shape of its
        # own fills ``values`` from it here
        self.before_collect: Callable[[], None] | None = None

    def child(self, *labels: str) -> Hist:
        h = self.children.get(labels)
        if h is None:
            h = self.children[labels] = Hist(self.buckets)
        return h

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        self.child(*labels).observe(value)

    def inc(self, labels: tuple[str, ...] = (), n: float = 1) -> None:
        self.values[labels] = self.values.get(labels, 0) + n

    def set(self, labels: tuple[str, ...], value: float) -> None:
        self.values[labels] = value

    def collect(self) -> Metric:
        if self.before_collect is not None:
            self.before_collect()
        if self.kind == "histogram":
            h = HistogramMetricFamily(self.name, self.help, labels=self.labels)
            for labels, child in sorted(self.children.items()):
                buckets, acc = [], 0
                for bound, n in zip((*self.buckets, float("inf")), child.counts, strict=True):
                    acc += n
                    buckets.append((_le(bound), acc))
                h.add_metric(list(labels), buckets, child.sum)
            return h
        cls = CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily
        family = cls(self.name, self.help, labels=self.labels)
        for labels, value in sorted(self.values.items()):
            family.add_metric(list(labels), value)
        return family


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


class Telemetry(Collector):
    """The families a broker's recorders fill; registered in the broker's registry."""

    def __init__(self) -> None:
        self.families: dict[str, Family] = {}

    def histogram(
        self,
        name: str,
        help_: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> Family:
        return self._add(Family("histogram", name, help_, labels, buckets))

    def counter(self, name: str, help_: str, labels: Sequence[str] = ()) -> Family:
        """``name`` without ``_total`` (prometheus-client adds it)."""
        return self._add(Family("counter", name, help_, labels))

    def gauge(self, name: str, help_: str, labels: Sequence[str] = ()) -> Family:
        return self._add(Family("gauge", name, help_, labels))

    def _add(self, family: Family) -> Family:
        existing = self.families.get(family.name)
        if existing is not None:  # two recorders share a family (one per listener, ...)
            return existing
        self.families[family.name] = family
        return family

    def collect(self) -> Iterator[Metric]:
        # a copy: /metrics renders between turns of the event loop, which may add a family
        for family in list(self.families.values()):
            yield family.collect()
