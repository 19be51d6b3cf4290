"""broker.group_metrics on an in-process broker (embedded stores): lag = log end minus
the committed offset, log ends from the broker's own logs or from the metadata store's
end keys, and the ``--lag-metrics-max-partitions`` cap."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker.server import Broker
from groupcoord.model import OffsetCommit, TopicPartition
from protocol.batch import read_header
from protocol.errors import ErrorCode
from protocol.records import build_batch
from tests.fixtures.inprocess import local_config

TOPIC = "lagged"


def _samples(b: Broker) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(b.group_metrics)
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def _produce(b: Broker, partition: int, batches: int) -> None:
    lg = await b.logs.get(TOPIC, partition)
    for i in range(batches):
        recs: list[Any] = [(b"k", b"v%d" % i, []), (b"k", b"w%d" % i, [])]
        view = memoryview(bytearray(build_batch(recs)))
        res = lg.append(read_header(view), view)
        assert res.error == ErrorCode.NONE and res.done is not None
        b.logs.appended(lg, len(view))
        await res.done


def _lag(group: str, partition: int) -> tuple[str, tuple[tuple[str, str], ...]]:
    labels = {"group": group, "topic": TOPIC, "partition": str(partition)}
    return ("kafscale_group_lag", tuple(sorted(labels.items())))


async def test_lag_from_owned_logs_then_from_end_keys_and_the_cap(tmp_path: Path) -> None:
    b = Broker(local_config(tmp_path, lag_metrics_max_partitions=10))
    await b.start()
    try:
        await b.topics.create(TOPIC, 3)
        await _produce(b, 0, 5)  # log end 10
        await _produce(b, 1, 2)  # log end 4
        assert b.groups is not None
        commits = [OffsetCommit(TopicPartition(TOPIC, p), off) for p, off in ((0, 3), (1, 4))]
        errors = await b.groups.commit_offsets("g", -1, "", None, commits)
        assert set(errors.values()) == {ErrorCode.NONE}
        await b.group_metrics.refresh()
        m = _samples(b)
        assert m[_lag("g", 0)] == 10 - 3 and m[_lag("g", 1)] == 0
        assert m[("kafscale_group_state", (("group", "g"), ("state", "Empty")))] == 1
        assert m[("kafscale_group_lag_partitions_omitted", ())] == 0
    finally:
        await b.stop()

    # a new broker owns nothing yet: the log ends come from the metadata store
    b = Broker(local_config(tmp_path, lag_metrics_max_partitions=1))
    await b.start()
    try:
        assert not b.logs.logs
        await b.group_metrics.refresh()
        m = _samples(b)
        assert m[_lag("g", 0)] == 7
        assert _lag("g", 1) not in m  # over the cap
        assert m[("kafscale_group_lag_partitions_omitted", ())] == 1
    finally:
        await b.stop()
