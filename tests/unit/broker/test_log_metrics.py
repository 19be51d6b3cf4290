"""broker.log_metrics on an in-process broker: flush cycles, segments and batches, bytes
and records in and out, ownership gained and lost by reason, bytes reclaimed."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker.metrics import broker_registry
from broker.server import Broker
from tests.unit.broker.maintenance_helpers import TOPIC, config, maint, produce


def _samples(b: Broker) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    reg: CollectorRegistry = broker_registry(b)
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_write_read_ownership_and_reclaimed_bytes(tmp_path: Path) -> None:
    b = Broker(config(tmp_path))
    await b.start()
    try:
        await b.topics.create(TOPIC, 1)
        await produce(b.logs, 3)  # three batches of two records, one segment each
        lg = await b.logs.get(TOPIC, 0)
        sizes = [s.size for s in lg.segments]
        assert len(sizes) == 3
        got = await b.logs.read(lg, 0, 1 << 20)
        assert got
        await b.logs.flusher.idle()  # a cycle's duration is observed after its acks
        m = _samples(b)
        topic = (("topic", TOPIC),)
        assert m[("kafscale_topic_records_in_total", topic)] == 6
        assert m[("kafscale_batch_records_count", ())] == 3
        assert m[("kafscale_batch_records_sum", ())] == 6
        assert m[("kafscale_segment_size_bytes_sum", ())] == sum(sizes)
        assert m[("kafscale_flush_cycle_duration_seconds_count", ())] >= 3
        # one PUT per segment (its index inside), one commit per cycle
        assert m[("kafscale_segment_put_duration_seconds_count", ())] == 3
        assert m[("kafscale_flush_commit_duration_seconds_count", ())] == 3
        assert m[("kafscale_flush_wait_seconds_count", ())] == 3  # one partition per cycle
        assert m[("kafscale_topic_records_out_total", topic)] == 6
        assert m[("kafscale_topic_bytes_out_total", topic)] == sum(v.nbytes for v in got)
        assert m[("kafscale_ownership_acquisitions_total", ())] == 1

        assert await maint(b).delete_records(lg, lg.hw) == 6  # drops all three segments
        m = _samples(b)
        assert m[("kafscale_maintenance_reclaimed_bytes_total", ())] == sum(sizes)
        assert m[("kafscale_maintenance_dropped_segments_total", ())] == 3

        b.logs.drop(lg, "fenced (test)")
        m = _samples(b)
        assert m[("kafscale_ownership_losses_total", (("reason", "fenced"),))] == 1
        assert m[("kafscale_ownership_losses_total", (("reason", "handoff"),))] == 0
        assert m[("kafscale_partitions_owned", ())] == 0
    finally:
        await b.stop()
