"""Consumer-group metrics for the groups this broker coordinates (docs/operations.md,
"Consumer groups and lag").

Computed when ``/metrics`` is scraped (``refresh()``, awaited by the HTTP handler before
it renders): members, state and generation of every group this broker coordinates, and
the lag of each committed partition (the committed log end minus the committed offset).
Log ends come from this broker's own logs for the partitions it owns and from the
metadata store's end keys for the rest (one transaction per ``max_txn_ops`` partitions).
At most ``--lag-metrics-max-partitions`` lag series are exported (groups in name order,
partitions in order); ``kafscale_group_lag_partitions_omitted`` counts the rest. The
offsets are decoded and the series built a few hundred at a time, with a turn of the event
loop between (docs/benchmarks.md, "Round 21").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from broker.meta.base import Get, MetaStoreError
from broker.meta.schema import EndValue, end_key
from broker.telemetry import PREFIX
from groupcoord.model import GroupState

if TYPE_CHECKING:
    from broker.server import Broker

log = logging.getLogger(__name__)

STATES = tuple(s.value for s in GroupState)
#: partitions whose series are built between two turns of the event loop (~10 us each)
ROWS_PER_TURN = 200


class GroupMetrics(Collector):
    def __init__(self, broker: Broker, max_partitions: int) -> None:
        self.broker = broker
        self.max_partitions = max(0, max_partitions)
        self._families: list[Metric] = []

    def collect(self) -> Iterator[Metric]:
        yield from self._families

    async def refresh(self) -> None:
        """Recompute the families (keeps the previous ones if that fails: the rest of
        ``/metrics`` is served regardless)."""
        try:
            self._families = await self._compute()
        except MetaStoreError as exc:
            log.warning("consumer-group metrics not refreshed: %s", exc)
        except Exception:  # a bug here must not take the whole scrape down
            log.exception("consumer-group metrics failed")

    async def _compute(self) -> list[Metric]:
        members = GaugeMetricFamily(
            PREFIX + "group_members",
            "Members of the groups this broker coordinates.",
            labels=["group"],
        )
        state = GaugeMetricFamily(
            PREFIX + "group_state",
            "1 for the group's current state (Empty, PreparingRebalance, CompletingRebalance, "
            "Stable, Dead).",
            labels=["group", "state"],
        )
        rebalances = CounterMetricFamily(
            PREFIX + "group_rebalances",
            "Rebalances the group completed (its generation).",
            labels=["group"],
        )
        lag = GaugeMetricFamily(
            PREFIX + "group_lag",
            "Committed log end minus the group's committed offset, per partition.",
            labels=["group", "topic", "partition"],
        )
        committed = GaugeMetricFamily(
            PREFIX + "group_committed_offset",
            "The group's committed offset, per partition.",
            labels=["group", "topic", "partition"],
        )
        omitted = 0
        coord = self.broker.groups
        rows: list[tuple[str, str, int, int]] = []
        if coord is not None:
            for listing in await coord.list_groups():
                gid = listing.group_id
                group = coord.groups.get(gid)
                members.add_metric([gid], len(group.members) if group is not None else 0)
                for s in STATES:
                    state.add_metric([gid, s], 1.0 if s == listing.state else 0.0)
                rebalances.add_metric([gid], group.generation if group is not None else 0)
                _err, offsets = await coord.fetch_offsets(gid)
                for tp, rec in sorted(offsets.items(), key=lambda i: (i[0].topic, i[0].partition)):
                    if len(rows) >= self.max_partitions:
                        omitted += 1
                        continue
                    rows.append((gid, tp.topic, tp.partition, rec.offset))
        ends = await self._log_ends({(t, p) for _g, t, p, _o in rows})
        for i, (gid, topic, partition, offset) in enumerate(rows, 1):
            labels = [gid, topic, str(partition)]
            committed.add_metric(labels, offset)
            if offset >= 0:  # a partition never written to has no end key: its end is 0
                lag.add_metric(labels, max(0, ends.get((topic, partition), 0) - offset))
            if i % ROWS_PER_TURN == 0:  # thousands of partitions: let requests run between
                await asyncio.sleep(0)
        dropped = GaugeMetricFamily(
            PREFIX + "group_lag_partitions_omitted",
            "Committed partitions left out of kafscale_group_lag by --lag-metrics-max-partitions.",
            value=omitted,
        )
        return [members, state, rebalances, committed, lag, dropped]

    async def _log_ends(self, tps: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
        ends: dict[tuple[str, int], int] = {}
        remote: list[tuple[str, int]] = []
        for tp in sorted(tps):
            lg = self.broker.logs.logs.get(tp)
            if lg is not None:
                ends[tp] = lg.hw
            else:
                remote.append(tp)
        meta = self.broker.meta
        step = max(1, meta.max_txn_ops)
        for i in range(0, len(remote), step):
            chunk = remote[i : i + step]
            res = await meta.txn([], [Get(end_key(t, p)) for t, p in chunk])
            for tp, found in zip(chunk, res.gets, strict=True):
                if found:
                    ends[tp] = EndValue.decode(found[0].value).next_offset
        return ends
