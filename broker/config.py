"""Broker configuration: one frozen dataclass, filled from flags and KAFSCALE_* variables."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from broker.security.config import SecurityConfig


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    listen_host: str = "127.0.0.1"
    listen_port: int = 9092
    advertised_host: str = "127.0.0.1"
    advertised_port: int = 9092
    store_url: str = "file://./data"
    meta_url: str = "embedded"
    data_dir: str = "./data"
    meta_prefix: str = "/kafscale"
    namespace: str = "default"
    node_id: int = 0
    rack: str | None = None
    http: str | None = None  # "host:port" for /healthz /readyz /metrics
    cluster_id: str = "kafscale"
    # topics
    auto_create_topics: bool = True
    default_partitions: int = 1
    # write path (docs/architecture.md, the write path)
    flush_bytes: int = 4 * 1024 * 1024
    flush_interval_ms: int = 5
    # no cycle in flight: start one at once instead of waiting out flush_interval_ms
    # (False: batch by time, fewer and larger objects at low load)
    flush_when_idle: bool = True
    flush_concurrency: int = 16
    # a flush cycle of at least this many partitions writes their segments as ONE shared
    # object (segments/shared.py, docs/format.md "Shared objects"); 0: never
    shared_objects_min_partitions: int = 0
    # a flush cycle of at least this many partitions commits as ONE metadata key, folded
    # into the partitions' own keys later (broker/fold.py, docs/architecture.md "Cycle
    # keys"); 0: never
    cycle_keys_min_partitions: int = 0
    # how often the controller looks for shared objects no entry can name any more
    shared_sweep_interval_ms: int = 300_000
    max_request_bytes: int = 100 * 1024 * 1024
    # announced bytes of partially received frames, per broker (Kafka's
    # queued.max.request.bytes); a frame waits for room before its bytes are read
    queued_max_request_bytes: int = 256 * 1024 * 1024
    request_read_timeout_ms: int = 60_000  # a frame must be complete this long after its length
    max_message_bytes: int = 16 * 1024 * 1024
    # Full produce validation (protocol.validate); an internal switch for bench/broker.py
    # to measure its cost, deliberately not a flag: without it a client can poison a log.
    validate_records: bool = True
    connection_inflight_bytes: int = 64 * 1024 * 1024
    broker_inflight_bytes: int = 512 * 1024 * 1024
    # read path (docs/architecture.md)
    cache_bytes: int = 256 * 1024 * 1024
    # bytes loaded ahead of a reader of older segments, at most a third of the cache
    # (broker/segment_loader.py); 0: no readahead
    readahead_bytes: int = 24 * 1024 * 1024
    max_fetch_sessions: int = 1000  # KIP-227 session cache slots (broker/fetch_sessions.py)
    index_interval: int = 100
    # log maintenance on the partition owner (broker/maintenance.py, docs/format.md)
    merge_interval_ms: int = 1000  # 0: never merge small segments
    merge_small_bytes: int = 1024 * 1024  # segments below this are merge candidates
    merge_max_bytes: int = 16 * 1024 * 1024  # a merged segment stays below this
    merge_min_segments: int = 4  # merge runs of at least this many small segments
    merge_min_age_ms: int = 2000  # leave segments this young alone (tailing readers)
    retention_check_interval_ms: int = 30_000  # 0: never enforce retention.ms/.bytes
    segment_delete_grace_ms: int = 60_000  # replaced objects are deleted this much later
    # Kafka's producer.id.expiration.ms: an idempotent producer that has not written to a
    # partition this long is forgotten there (0: never); how often the owner looks
    producer_id_expiration_ms: int = 86_400_000
    producer_id_expiration_check_interval_ms: int = 600_000
    # log compaction (broker/compaction.py): key map memory per pass, bytes/s (0: no limit)
    compaction_buffer_bytes: int = 64 * 1024 * 1024
    compaction_max_bytes_per_sec: int = 0
    # cluster (docs/architecture.md, ownership)
    lease_ttl_s: int = 10
    # the process's garbage collector (broker/gc_policy.py): survivors of a full collection
    # are frozen, everything is thawed and collected this often (0: Python's collector)
    gc_thaw_interval_s: int = 3600
    # the heap's free pages are given back to the OS this often, when 32 MiB or more are
    # free (broker/heap_trim.py; glibc only; 0: never)
    heap_trim_interval_ms: int = 5000
    # groups (issue 3)
    offsets_retention_minutes: int = 7 * 24 * 60
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1_800_000
    group_initial_rebalance_delay_ms: int = 0
    # listeners, TLS, SASL, ACLs (broker/security/, docs/operations.md "Security")
    security: SecurityConfig = SecurityConfig()
    # observability (docs/operations.md, "Metrics")
    lag_metrics_max_partitions: int = 1000  # consumer-lag series per broker, at most
    # per-request histograms; an internal switch for bench/obs.py to measure their cost
    request_metrics: bool = True
    # KIP-848 consumer groups (groupcoord/consumer_coordinator.py)
    group_consumer_session_timeout_ms: int = 45_000
    group_consumer_heartbeat_interval_ms: int = 5_000
    group_consumer_migration_policy: str = "bidirectional"
    # transactions (issue 9): Kafka's transaction.max.timeout.ms
    transaction_max_timeout_ms: int = 900_000
    # Kafka's transactional.id.expiration.ms: an id idle this long is forgotten (0: never)
    transactional_id_expiration_ms: int = 604_800_000

    @staticmethod
    def new_cluster_id() -> str:
        return uuid.uuid4().hex[:22]
