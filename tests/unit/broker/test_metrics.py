"""broker.metrics: the collector reads the broker's live figures at every scrape."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from broker.metrics import broker_registry, exposition
from broker.telemetry import Telemetry


class _Conn:
    def __init__(self, paused: bool = False, inflight: int = 0) -> None:
        self.paused, self.inflight = paused, inflight


def _fake_broker(maintenance: Any) -> Any:
    cache = SimpleNamespace(bytes=4096, hits=7, misses=3, evictions=1)
    logs = SimpleNamespace(
        logs={
            ("a", 0): SimpleNamespace(producers=[1, 2, 3]),  # sized like a ProducerState
            ("a", 1): SimpleNamespace(producers=[]),
        },
        pending_bytes=123,
        cache=cache,
        stats={
            "flush_cycles": 5,
            "segments": 4,
            "segment_bytes": 1000,
            "txns": 5,
            "shared_objects": 1,
            "shared_segments": 3,
        },
        maintenance=maintenance,
        shared_sweep=SimpleNamespace(stats={"shared_passes": 8, "shared_deleted": 1}),
        folder=SimpleNamespace(
            stats={
                "cycle_txns": 4,
                "fold_txns": 2,
                "folds": 2,
                "folded_segments": 7,
                "keys_deleted": 3,
                "aborted": 1,
            }  # fmt: skip
        ),
        committer=SimpleNamespace(stats={"ambiguous": 2, "resolved": 2, "unresolved": 0}),
    )
    cluster_stats = {"lease_refreshes": 30, "lease_losses": 1, "max_refresh_gap_s": 3.5}
    return SimpleNamespace(
        connections={_Conn(), _Conn(), _Conn(True, 50)},
        admission=SimpleNamespace(inflight=77, frame_bytes=9),
        telemetry=Telemetry(),
        group_metrics=Telemetry(),  # no families, like a broker without groups
        logs=logs,
        topics=SimpleNamespace(all=lambda: ["a", "b"]),
        cluster=SimpleNamespace(brokers=lambda: [0, 1, 2, 3], stats=cluster_stats),
    )


def _scrape(registry: CollectorRegistry) -> dict[str, tuple[str, str, float]]:
    """name -> (type, HELP, value) of every family in the text exposition."""
    body, content_type = exposition(registry, None)
    assert content_type.startswith("text/plain")
    out = {}
    for fam in text_string_to_metric_families(body.decode()):
        (sample,) = fam.samples
        out[sample.name] = (fam.type, fam.documentation, sample.value)
    return out


def test_every_figure_is_exported_with_help_and_type() -> None:
    maintenance = SimpleNamespace(
        stats={
            "merges": 2,
            "merged_segments": 9,
            "merged_bytes": 5120,
            "dropped_segments": 4,
            "deleted": 11,
        },  # fmt: skip
        deleter=SimpleNamespace(stats={"deleted": 11, "swept": 6}),
    )
    got = _scrape(broker_registry(cast(Any, _fake_broker(maintenance))))
    expected = {
        "kafscale_connections": ("gauge", 3),
        "kafscale_inflight_bytes": ("gauge", 77),
        "kafscale_pending_bytes": ("gauge", 123),
        "kafscale_partitions_owned": ("gauge", 2),
        "kafscale_producer_ids": ("gauge", 3),
        "kafscale_topics": ("gauge", 2),
        "kafscale_live_brokers": ("gauge", 4),
        "kafscale_segment_cache_bytes": ("gauge", 4096),
        "kafscale_admission_paused_connections": ("gauge", 1),
        "kafscale_admission_held_bytes": ("gauge", 50),
        "kafscale_admission_frame_bytes": ("gauge", 9),
        "kafscale_commits_unknown_outcome_total": ("counter", 2),
        "kafscale_commits_resolved_total": ("counter", 2),
        "kafscale_commits_unresolved_total": ("counter", 0),
        "kafscale_objects_retired_deleted_total": ("counter", 11),
        "kafscale_objects_swept_total": ("counter", 6),
        "kafscale_lease_refreshes_total": ("counter", 30),
        "kafscale_lease_losses_total": ("counter", 1),
        "kafscale_lease_refresh_gap_max_seconds": ("gauge", 3.5),
        "kafscale_segment_cache_hits_total": ("counter", 7),
        "kafscale_segment_cache_misses_total": ("counter", 3),
        "kafscale_segment_cache_evictions_total": ("counter", 1),
        "kafscale_flush_cycles_total": ("counter", 5),
        "kafscale_segments_total": ("counter", 4),
        "kafscale_segment_bytes_total": ("counter", 1000),
        "kafscale_txns_total": ("counter", 5),
        "kafscale_shared_objects_total": ("counter", 1),
        "kafscale_shared_segments_total": ("counter", 3),
        "kafscale_shared_sweep_passes_total": ("counter", 8),
        "kafscale_shared_objects_deleted_total": ("counter", 1),
        "kafscale_cycle_txns_total": ("counter", 4),
        "kafscale_fold_txns_total": ("counter", 2),
        "kafscale_folds_total": ("counter", 2),
        "kafscale_folded_segments_total": ("counter", 7),
        "kafscale_cycle_keys_deleted_total": ("counter", 3),
        "kafscale_cycle_aborted_total": ("counter", 1),
        "kafscale_maintenance_merges_total": ("counter", 2),
        "kafscale_maintenance_merged_segments_total": ("counter", 9),
        "kafscale_maintenance_merged_bytes_total": ("counter", 5120),
        "kafscale_maintenance_dropped_segments_total": ("counter", 4),
        "kafscale_maintenance_deleted_objects_total": ("counter", 11),
    }
    assert {name: (t, v) for name, (t, _h, v) in got.items()} == expected
    for name, (_t, help_, _v) in got.items():
        assert help_ and help_ != name, name


def test_values_are_read_at_scrape_time() -> None:
    broker = _fake_broker(SimpleNamespace(stats={"merges": 0}, deleter=SimpleNamespace(stats={})))
    registry = broker_registry(cast(Any, broker))
    assert _scrape(registry)["kafscale_maintenance_merges_total"][2] == 0
    broker.logs.stats["segments"] = 40
    broker.logs.maintenance.stats["merges"] = 3
    broker.admission.inflight = 0
    broker.connections.clear()
    got = _scrape(registry)
    assert got["kafscale_segments_total"][2] == 40
    assert got["kafscale_maintenance_merges_total"][2] == 3
    assert got["kafscale_inflight_bytes"][2] == 0 and got["kafscale_connections"][2] == 0


def test_new_stats_keys_are_exported_and_missing_maintenance_is_skipped() -> None:
    broker = _fake_broker(None)
    broker.logs.stats["retried_commits"] = 6
    got = _scrape(broker_registry(cast(Any, broker)))
    assert got["kafscale_retried_commits_total"][0:1] == ("counter",)
    assert got["kafscale_retried_commits_total"][2] == 6
    assert "retried_commits" in got["kafscale_retried_commits_total"][1]
    assert not [name for name in got if "maintenance" in name]


def test_registries_are_per_broker_and_openmetrics_is_negotiated() -> None:
    a, b = _fake_broker(None), _fake_broker(None)
    b.admission.inflight = 5
    ra, rb = broker_registry(cast(Any, a)), broker_registry(cast(Any, b))
    assert _scrape(ra)["kafscale_inflight_bytes"][2] == 77
    assert _scrape(rb)["kafscale_inflight_bytes"][2] == 5
    body, content_type = exposition(ra, "application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n") and b"kafscale_inflight_bytes 77" in body
