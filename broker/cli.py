"""The ``kafscale`` command line (DESIGN §10).

Every flag of ``kafscale broker`` can also be set by an environment variable
``KAFSCALE_<FLAG>`` (upper case, ``-`` becomes ``_``); a flag on the command line wins.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from broker.config import BrokerConfig

_DEFAULTS = BrokerConfig()
LOCAL_FLUSH_INTERVAL_MS = 2  # a local directory commits in a few ms
S3_FLUSH_INTERVAL_MS = 5  # an S3 PUT takes tens of ms: batch a little more

# flag -> (config field, type, help)
_BROKER_FLAGS: list[tuple[str, str, Callable[[str], object], str]] = [
    ("listen", "", str, "HOST:PORT to listen on (default 127.0.0.1:9092)"),
    ("advertised-listener", "", str, "HOST:PORT clients are told (default: --listen)"),
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
        lambda v: v.lower() in ("1", "true", "yes"),
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
    ("cache-bytes", "cache_bytes", int, "segment cache size in bytes"),
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
        "segments smaller than this are merged (default 1048576)",
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
    ("log-level", "", str, "DEBUG, INFO (default), WARNING"),
]


def _env(flag: str) -> str | None:
    return os.environ.get("KAFSCALE_" + flag.upper().replace("-", "_"))


def _split_hostport(value: str, default_port: int) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host:
        return value, default_port
    return host.strip("[]"), int(port)


def broker_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kafscale broker",
        description="Run a Kafka-compatible broker. Each flag also reads KAFSCALE_<FLAG>.",
    )
    for flag, _field, _typ, help_ in _BROKER_FLAGS:
        env = "KAFSCALE_" + flag.upper().replace("-", "_")
        p.add_argument(f"--{flag}", default=None, help=f"{help_} [env {env}]")
    return p


def config_from_args(argv: list[str]) -> tuple[BrokerConfig, str]:
    args = vars(broker_parser().parse_args(argv))
    values: dict[str, Any] = {}
    raw: dict[str, str] = {}
    for flag, field, typ, _help in _BROKER_FLAGS:
        v = args.get(flag.replace("-", "_"))
        if v is None:
            v = _env(flag)
        if v is None:
            continue
        raw[flag] = v
        if field:
            values[field] = typ(v)
    host, port = _split_hostport(raw.get("listen", "127.0.0.1:9092"), 9092)
    values["listen_host"], values["listen_port"] = host, port
    adv = raw.get("advertised-listener")
    if adv:
        ahost, aport = _split_hostport(adv, port)
    else:
        ahost, aport = (host if host not in ("0.0.0.0", "::", "") else "127.0.0.1"), port
    values["advertised_host"], values["advertised_port"] = ahost, aport
    store = str(values.get("store_url", ""))
    if store and "://" not in store:
        values["store_url"] = "file://" + store
    if "flush_interval_ms" not in values:  # measured defaults (docs/benchmarks.md)
        s3 = str(values.get("store_url", "")).startswith("s3://")
        values["flush_interval_ms"] = S3_FLUSH_INTERVAL_MS if s3 else LOCAL_FLUSH_INTERVAL_MS
    known = {f.name for f in fields(BrokerConfig)}
    return BrokerConfig(**{k: v for k, v in values.items() if k in known}), raw.get(
        "log-level", "INFO"
    )


M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
MMAP_THRESHOLD_BYTES = 128 * 1024


def _fixed_mmap_threshold() -> None:
    """Serve every allocation above 128 KiB (segments, request frames) with its own mmap,
    so freeing it returns the memory to the OS. glibc otherwise raises the threshold after
    such blocks are freed and keeps later ones in the heap: the broker's RSS then grew
    ~100 MiB past its configured buffers under sustained load (docs/benchmarks.md). The
    cost: page faults on each new frame (a frame-buffer pool would remove it)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    except (OSError, AttributeError):  # not glibc: nothing to tune
        pass


def _run_broker(argv: list[str]) -> int:
    _fixed_mmap_threshold()
    config, level = config_from_args(argv)
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from broker.server import serve

    try:
        import uvloop

        runner: Callable[..., object] = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency
        runner = asyncio.run
    try:
        runner(serve(config))
    except OSError as exc:
        logging.getLogger("kafscale").error("cannot start broker: %s", exc)
        return 1
    return 0


def _run_segments(argv: list[str]) -> int:
    if not argv or argv[0] != "inspect":
        print("usage: kafscale segments inspect PATH|URL [--verify]", file=sys.stderr)
        return 2
    from segments.inspect import main as inspect_main

    return inspect_main(argv[1:])


def _run_partitions(argv: list[str]) -> int:
    from broker.repair import main as repair_main

    return repair_main(argv)


def _run_groups(argv: list[str]) -> int:
    from broker.cli_groups import main as groups_main

    return groups_main(argv)


def _run_ingest(argv: list[str]) -> int:
    from ingest_job.cli import main as ingest_main

    return ingest_main(argv)


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "broker": _run_broker,
    "segments": _run_segments,
    "groups": _run_groups,
    "partitions": _run_partitions,
    "ingest": _run_ingest,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(
            "usage: kafscale {broker,groups,segments,partitions,ingest} ...\n\n"
            "  broker     run a broker (kafscale broker --help)\n"
            "  groups     list | describe GROUP | reset-offsets ... | delete GROUP\n"
            "  segments   inspect PATH|URL [--verify]\n"
            "  partitions truncate TOPIC PARTITION --to OFFSET [--execute]\n"
            "  ingest     turn committed segments into Iceberg tables",
            file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout,
        )
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
