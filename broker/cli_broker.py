"""``kafscale broker``: its flags, the configuration they make, and running the broker.

Every flag can also be set by an environment variable ``KAFSCALE_<FLAG>`` (upper case,
``-`` becomes ``_``); a flag on the command line wins (``broker.cli.EnvParser``).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from broker.cli import EnvParser, bool_arg
from broker.cli_security import add_broker_flags as add_security_flags
from broker.cli_security import security_config
from broker.config import BrokerConfig
from broker.logfmt import FORMATS, setup_logging

LOCAL_FLUSH_INTERVAL_MS = 2  # a local directory commits in a few ms
S3_FLUSH_INTERVAL_MS = 5  # an S3 PUT takes tens of ms: batch a little more
# on S3 a merge re-reads and re-writes its segments over the network: segments of a
# full producer batch (~1 MB) stay as they are (docs/benchmarks.md, "Round 4")
S3_MERGE_SMALL_BYTES = 512 * 1024
DEFAULT_LISTEN = ("127.0.0.1", 9092)

log = logging.getLogger(__name__)


def hostport(value: str) -> tuple[str, int | None]:
    """``HOST:PORT``, ``[V6]:PORT`` or ``HOST`` -> (host, port or None)."""
    host, sep, port = value.rpartition(":")
    if not sep or (value.startswith("[") and not host.endswith("]")):
        return value.strip("[]"), None
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"not HOST:PORT: {value!r}")
    return host.strip("[]"), int(port)


APPEND_FLAGS = frozenset({"advertised-listener"})


def migration_policy(value: str) -> str:
    """``group.consumer.migration.policy``: disabled, upgrade, downgrade, bidirectional."""
    policy = value.strip().lower()
    if policy not in ("disabled", "upgrade", "downgrade", "bidirectional"):
        raise ValueError(f"not a migration policy: {value!r}")
    return policy


# flag -> (config field, type, help)
BROKER_FLAGS: list[tuple[str, str, Callable[[str], object], str]] = [
    ("listen", "", hostport, "HOST:PORT to listen on (default 127.0.0.1:9092)"),
    (
        "advertised-listener",
        "",
        str,
        "HOST:PORT clients are told (default: --listen), or NAME://HOST:PORT for a "
        "--listener; repeatable",
    ),
    (
        "store",
        "store_url",
        str,
        "object store: file://DIR or s3://BUCKET/PREFIX?endpoint=URL"
        "&region=R&access_key=K&secret_key=S (default file://./data)",
    ),
    ("meta", "meta_url", str, "metadata store: embedded or etcd://HOST:PORT[,HOST:PORT]"),
    ("data-dir", "data_dir", str, "directory of the embedded metadata store (default ./data)"),
    ("meta-prefix", "meta_prefix", str, "key prefix in the metadata store (default /kafscale)"),
    ("namespace", "namespace", str, "object key namespace (default 'default')"),
    ("node-id", "node_id", int, "this broker's id, unique in the cluster (default 0)"),
    ("rack", "rack", str, "rack reported in Metadata"),
    ("http", "http", str, "HOST:PORT for /healthz /readyz /metrics (default off)"),
    (
        "auto-create-topics",
        "auto_create_topics",
        bool_arg,
        "create topics on first Metadata/Produce (default true)",
    ),
    ("default-partitions", "default_partitions", int, "partitions of auto-created topics"),
    ("flush-bytes", "flush_bytes", int, "flush a partition's buffer at this size"),
    (
        "flush-interval-ms",
        "flush_interval_ms",
        int,
        "flush buffers at most this old (ms; default 2 on file://, 5 on s3://)",
    ),
    (
        "flush-when-idle",
        "flush_when_idle",
        bool_arg,
        "with no flush cycle in flight, start one at once instead of waiting out "
        "--flush-interval-ms (default true; false: batch by time, fewer larger objects)",
    ),
    (
        "shared-objects-min-partitions",
        "shared_objects_min_partitions",
        int,
        "a flush cycle with small segments of at least this many partitions writes them as "
        'one shared object (default 0 = never; docs/operations.md, "Shared objects")',
    ),
    (
        "cycle-keys-min-partitions",
        "cycle_keys_min_partitions",
        int,
        "a flush cycle of at least this many partitions commits as one metadata key, folded "
        'later (default 0 = never; docs/operations.md, "Cycle keys")',
    ),
    (
        "shared-sweep-interval-ms",
        "shared_sweep_interval_ms",
        int,
        "how often the controller deletes shared objects no entry names (default 300000)",
    ),
    ("cache-bytes", "cache_bytes", int, "segment cache size in bytes"),
    (
        "readahead-bytes",
        "readahead_bytes",
        int,
        "bytes read ahead of a consumer of older segments (default 25165824, at most a "
        "third of the cache; 0 = none)",
    ),
    (
        "max-fetch-sessions",
        "max_fetch_sessions",
        int,
        "incremental fetch sessions (KIP-227) kept per broker (default 1000; 0 = none)",
    ),
    (
        "merge-interval-ms",
        "merge_interval_ms",
        int,
        "how often the owner merges small segments (default 1000; 0 = never)",
    ),
    (
        "merge-small-bytes",
        "merge_small_bytes",
        int,
        "segments smaller than this are merged (default 1048576 on file://, 524288 on s3://)",
    ),
    ("merge-max-bytes", "merge_max_bytes", int, "largest merged segment (default 16777216)"),
    (
        "merge-min-segments",
        "merge_min_segments",
        int,
        "merge runs of at least this many small segments (default 4)",
    ),
    (
        "merge-min-age-ms",
        "merge_min_age_ms",
        int,
        "merge only segments committed at least this long ago (default 2000)",
    ),
    (
        "retention-check-interval-ms",
        "retention_check_interval_ms",
        int,
        "how often retention.ms/retention.bytes are enforced (default 30000; 0 = never)",
    ),
    (
        "producer-id-expiration-ms",
        "producer_id_expiration_ms",
        int,
        "an idempotent producer idle this long is forgotten by a partition (default "
        "86400000, 1 day; 0: never)",
    ),
    (
        "producer-id-expiration-check-interval-ms",
        "producer_id_expiration_check_interval_ms",
        int,
        "how often partitions look for idle producers (default 600000)",
    ),
    (
        "compaction-buffer-bytes",
        "compaction_buffer_bytes",
        int,
        "memory for one compaction pass's key map (default 67108864)",
    ),
    (
        "compaction-max-bytes-per-sec",
        "compaction_max_bytes_per_sec",
        int,
        "throttle of compaction reads and writes (default 0 = unlimited)",
    ),
    (
        "segment-delete-grace-ms",
        "segment_delete_grace_ms",
        int,
        "delay before merged-away or expired segment objects are deleted (default 60000)",
    ),
    (
        "connection-inflight-bytes",
        "connection_inflight_bytes",
        int,
        "unanswered request bytes per connection before it stops reading",
    ),
    (
        "broker-inflight-bytes",
        "broker_inflight_bytes",
        int,
        "unanswered request bytes per broker before connections stop reading",
    ),
    ("max-request-bytes", "max_request_bytes", int, "largest request frame accepted"),
    (
        "queued-max-request-bytes",
        "queued_max_request_bytes",
        int,
        "announced bytes of partially received frames per broker (default 268435456)",
    ),
    (
        "request-read-timeout-ms",
        "request_read_timeout_ms",
        int,
        "close a connection whose frame is incomplete this long after its length (default 60000)",
    ),
    ("lease-ttl", "lease_ttl_s", int, "metadata lease TTL in seconds (default 10)"),
    (
        "gc-thaw-interval-s",
        "gc_thaw_interval_s",
        int,
        "objects surviving a full garbage collection are frozen out of later ones, and "
        "thawed and collected this often (default 3600; 0: Python's own collector)",
    ),
    (
        "heap-trim-interval-ms",
        "heap_trim_interval_ms",
        int,
        "give the heap's free pages back to the OS this often when 32 MiB or more are free "
        "(default 5000; 0: never; glibc only)",
    ),
    (
        "group-min-session-timeout-ms",
        "group_min_session_timeout_ms",
        int,
        "smallest consumer session timeout accepted (default 6000)",
    ),
    (
        "group-max-session-timeout-ms",
        "group_max_session_timeout_ms",
        int,
        "largest consumer session timeout accepted (default 1800000)",
    ),
    (
        "group-initial-rebalance-delay-ms",
        "group_initial_rebalance_delay_ms",
        int,
        "wait for more members before the first rebalance of an empty group (default 0)",
    ),
    (
        "offsets-retention-minutes",
        "offsets_retention_minutes",
        int,
        "committed offsets of empty groups expire after this (default 10080)",
    ),
    (
        "lag-metrics-max-partitions",
        "lag_metrics_max_partitions",
        int,
        "most consumer-lag series /metrics exports (default 1000; docs/operations.md)",
    ),
    (
        "group-consumer-session-timeout-ms",
        "group_consumer_session_timeout_ms",
        int,
        "KIP-848 consumer groups: member session timeout (default 45000)",
    ),
    (
        "group-consumer-heartbeat-interval-ms",
        "group_consumer_heartbeat_interval_ms",
        int,
        "KIP-848 consumer groups: heartbeat interval given to members (default 5000)",
    ),
    (
        "group-consumer-migration-policy",
        "group_consumer_migration_policy",
        migration_policy,
        "classic/consumer group conversion: disabled, upgrade, downgrade, bidirectional",
    ),
    (
        "transaction-max-timeout-ms",
        "transaction_max_timeout_ms",
        int,
        "largest transaction.timeout.ms a producer may ask for (default 900000)",
    ),
    (
        "transactional-id-expiration-ms",
        "transactional_id_expiration_ms",
        int,
        "a transactional id idle this long is forgotten (default 604800000, 7 days; 0: never)",
    ),
    ("log-level", "", str, "DEBUG, INFO (default), WARNING"),
    ("log-format", "", str, "text (default) or json: one JSON object per line"),
    (
        "workers",
        "",
        int,
        "broker processes to run, node ids and ports + 0..N-1 (default: the cores available;"
        " 1 with the embedded metadata store; docs/operations.md)",
    ),
    (
        "port-offset",
        "",
        int,
        "added to every listening, advertised and HTTP port (default 0; --workers gives"
        " worker i offset i)",
    ),
]


def broker_parser() -> EnvParser:
    pp = EnvParser(
        "kafscale broker",
        "Run a Kafka-compatible broker. Each flag also reads KAFSCALE_<FLAG>.",
    )
    for flag, _field, typ, help_ in BROKER_FLAGS:
        pp.option(f"--{flag}", help_, type=typ, append=flag in APPEND_FLAGS)
    add_security_flags(pp)
    return pp


def config_from_args(argv: Sequence[str]) -> tuple[BrokerConfig, str]:
    """The configuration the flags and ``KAFSCALE_*`` variables describe, and the log level."""
    args = vars(broker_parser().parse_args(argv))
    values: dict[str, Any] = {}
    for flag, field, _typ, _help in BROKER_FLAGS:
        value = args[flag.replace("-", "_")]
        if field and value is not None:
            values[field] = value
    host, port = args["listen"] or DEFAULT_LISTEN
    port = DEFAULT_LISTEN[1] if port is None else port
    values["listen_host"], values["listen_port"] = host, port
    adv = list(args["advertised_listener"] or [])
    args["advertised_named"] = [a for a in adv if "://" in a]
    plain = [a for a in adv if "://" not in a]
    if len(plain) > 1:
        raise SystemExit("kafscale broker: one HOST:PORT --advertised-listener (for --listen)")
    if plain:
        ahost, aport = hostport(plain[0])
        aport = port if aport is None else aport
    else:
        ahost, aport = (host if host not in ("0.0.0.0", "::", "") else "127.0.0.1"), port
    values["advertised_host"], values["advertised_port"] = ahost, aport
    try:
        security = security_config(
            args, (host, port, ahost, aport) if args["listen"] or plain else None
        )
    except ValueError as exc:
        raise SystemExit(f"kafscale broker: {exc}") from None
    values["security"] = security
    if security.listeners:  # the first listener stands for the broker's default address
        first = security.listeners[0]
        values["listen_host"], values["listen_port"] = first.host, first.port
        values["advertised_host"], values["advertised_port"] = (
            first.advertised_host,
            first.advertised_port,
        )
    store = str(values.get("store_url", ""))
    if store and "://" not in store:
        values["store_url"] = "file://" + store
    if args.get("s3_ca_bundle") and str(values.get("store_url", "")).startswith("s3://"):
        from urllib.parse import quote

        url = str(values["store_url"])
        sep = "&" if "?" in url else "?"
        values["store_url"] = f"{url}{sep}ca_bundle={quote(args['s3_ca_bundle'], safe='/')}"
    if "flush_interval_ms" not in values:  # measured defaults (docs/benchmarks.md)
        s3 = str(values.get("store_url", "")).startswith("s3://")
        values["flush_interval_ms"] = S3_FLUSH_INTERVAL_MS if s3 else LOCAL_FLUSH_INTERVAL_MS
    if "merge_small_bytes" not in values and str(values.get("store_url", "")).startswith("s3://"):
        values["merge_small_bytes"] = S3_MERGE_SMALL_BYTES
    config = BrokerConfig(**values)
    _check_urls(config)
    if args["port_offset"]:
        from broker.workers import shift_ports

        config = shift_ports(config, int(args["port_offset"]))
    return config, str(args["log_level"] or "INFO")


def _check_urls(config: BrokerConfig) -> None:
    """A ``--store`` or ``--meta`` no store would open is one line and exit 1 here, before
    any worker starts (not a traceback in each worker, restarted until it gives up)."""
    from broker.meta.base import check_meta_url
    from segments.store import check_store_url

    try:
        check_store_url(config.store_url)
        check_meta_url(config.meta_url)
    except ValueError as exc:
        raise SystemExit(f"kafscale broker: {exc}") from None


M_TRIM_THRESHOLD = -1  # glibc mallopt parameters
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 32 * 1024 * 1024


def _fixed_mmap_threshold() -> None:
    """Fix glibc's thresholds instead of letting them float: blocks above 32 MiB (glibc's
    largest threshold) get their own mmap (returned to the OS when freed); smaller ones,
    the ~1 MB request frames and the segments of flush cycles and merges (up to 16 MiB),
    are reused from the heap instead of page-faulted fresh each time (paired A/B:
    idempotent produce 5.4 -> 3.6 ms/MB with 4 MiB; plain produce segments of 4-8 MiB
    still cost 256 faults per MB until 32 MiB); free heap above 32 MiB is trimmed. One
    arena for every thread: a segment joined in a worker thread came from that thread's
    arena, fresh pages every time (docs/benchmarks.md, "Round 3: produce profile").
    glibc's floating threshold grew the RSS ~100 MiB past the configured buffers under
    sustained load ("Round 2b")."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
        libc.mallopt(M_ARENA_MAX, 1)
    except (OSError, AttributeError):  # not glibc: nothing to tune
        pass


def main(argv: list[str]) -> int:
    """``kafscale broker [FLAGS]``: run a broker until SIGTERM/SIGINT."""
    _fixed_mmap_threshold()
    config, level = config_from_args(argv)
    parser = broker_parser()
    fmt = str(vars(parser.parse_args(argv))["log_format"] or "text")
    if fmt not in FORMATS:
        print(f"kafscale broker: --log-format {fmt!r}: choose text or json", file=sys.stderr)
        return 2
    setup_logging(level, fmt)
    parser.warn_unknown_env(log)
    from broker.workers import WorkersError, supervise, workers_for

    try:
        workers = workers_for(argv, config)
    except WorkersError as exc:
        print(f"kafscale broker: {exc}", file=sys.stderr)
        return 2
    if workers > 1:
        return supervise(argv, config, workers)
    from broker.meta.base import MetaStoreError
    from broker.server import serve

    try:
        import uvloop

        runner: Callable[..., object] = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency
        runner = asyncio.run
    try:
        runner(serve(config))
    except (OSError, MetaStoreError) as exc:  # a port in use; the metadata store unreachable
        log.error("cannot start broker: %s", exc)
        return 1
    return 0
