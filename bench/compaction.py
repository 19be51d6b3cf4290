"""Log compaction benchmark: compaction throughput, and produce with and without it.

Run ``python -m bench.compaction [--quick] [--mb 1024] [--keys 10000]`` from the
repository root. For each target (``local``: a local-directory store with embedded
metadata; ``s3``: SeaweedFS S3 with embedded metadata) it starts a real broker process
(``--http`` for ``/metrics``) and measures, with confluent-kafka, acks=all, ``--value-bytes``
values over ``--keys`` keys (keyed updates):

- **compaction MB/s**: ``--mb`` MB of keyed updates are produced to a topic with
  ``cleanup.policy=delete`` (nothing compacts while loading); the policy is then switched
  to ``compact`` and the time until the first pass has swapped its segments in
  (``kafscale_compaction_passes_total``) is timed. MB/s = segment bytes the pass read
  (``kafscale_compaction_bytes_read_total``: the key map and the rewrite each read the
  log once) / that time, and the log's size before / that time;
- **produce MB/s and p99 latency**, the same volume of keyed updates at full speed to a
  topic with ``cleanup.policy=delete`` (no compaction), to one with ``compact`` and a huge
  ``min.compaction.lag.ms`` (no pass: the cost of refusing keyless records alone), and to
  one with ``compact`` and ``min.cleanable.dirty.ratio=0.01`` (passes run all along the
  produce); then a quarter of the volume paced at ``--rate`` msg/s (latency where client
  queueing does not dominate), without and with passes running.

Prints figures; it is not a test and asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.fs_probe import bench_dir
from bench.stats import percentile
from tests.fixtures.broker import BrokerProcess, free_port, start_broker

FAST = ["--merge-interval-ms", "200", "--segment-delete-grace-ms", "2000"]
RUNNING = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"}
LAGGED = {"cleanup.policy": "compact", "min.compaction.lag.ms": str(10**12)}


def _scrape(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.labels:
                out[s.name] = s.value
    return out


def _admin(bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap})


def _create(bootstrap: str, topic: str, configs: dict[str, str]) -> None:
    from confluent_kafka.admin import NewTopic

    admin = _admin(bootstrap)
    for fut in admin.create_topics([NewTopic(topic, 1, 1, config=configs)]).values():
        fut.result(30)


def _set_policy(bootstrap: str, topic: str, policy: str) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    entry = ConfigEntry("cleanup.policy", policy, incremental_operation=AlterConfigOpType.SET)
    res = ConfigResource("topic", topic, incremental_configs=[entry])
    admin = _admin(bootstrap)
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result(30)


def produce(
    bootstrap: str, topic: str, mb: float, keys: int, value_bytes: int, rate: float = 0.0
) -> tuple[float, float]:
    """Keyed updates totalling ``mb`` MB, at ``rate`` msg/s (0: as fast as possible);
    returns (MB/s, p99 delivery latency ms)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    n = int(mb * 1e6 / value_bytes)
    value = b"x" * value_bytes
    lat: list[float] = []
    errors: list[Any] = []

    def report(sent: float) -> Any:
        def cb(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(err)
            lat.append(time.monotonic() - sent)

        return cb

    t0 = time.monotonic()
    for i in range(n):
        if rate > 0:  # pacing (a benchmark, not a test)
            ahead = t0 + i / rate - time.monotonic()
            if ahead > 0:
                p.poll(ahead)
        while True:
            try:
                p.produce(
                    topic,
                    key=b"key-%d" % (i % keys),
                    value=value,
                    on_delivery=report(time.monotonic()),
                )
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    p.flush(120)
    elapsed = time.monotonic() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} produce errors, first {errors[0]}")
    lat.sort()
    return n * value_bytes / 1e6 / elapsed, percentile(lat, 0.99) * 1000


def compaction_run(b: BrokerProcess, metrics: str, args: argparse.Namespace) -> dict[str, float]:
    topic = f"cmp-bench-{uuid.uuid4().hex[:6]}"
    _create(b.bootstrap, topic, {"cleanup.policy": "delete"})
    produce(b.bootstrap, topic, args.mb, args.keys, args.value_bytes)
    before = _scrape(metrics)
    written = before.get("kafscale_segment_bytes_total", 0.0)
    passes0 = before.get("kafscale_compaction_passes_total", 0.0)
    read0 = before.get("kafscale_compaction_bytes_read_total", 0.0)
    t0 = time.monotonic()
    _set_policy(b.bootstrap, topic, "compact")
    while True:
        now = _scrape(metrics)
        if now.get("kafscale_compaction_passes_total", 0.0) > passes0:
            break
        if time.monotonic() - t0 > 1800:
            raise RuntimeError("no compaction pass in 30 minutes")
        time.sleep(0.05)
    elapsed = time.monotonic() - t0
    read = now["kafscale_compaction_bytes_read_total"] - read0
    return {
        "log_mb": written / 1e6,
        "seconds": elapsed,
        "read_mb_s": read / 1e6 / elapsed,
        "log_mb_s": written / 1e6 / elapsed,
        "out_mb": (now["kafscale_compaction_bytes_written_total"]) / 1e6,
    }


@contextlib.contextmanager
def target(name: str, work: Path) -> Iterator[tuple[BrokerProcess, str]]:
    http = f"127.0.0.1:{free_port()}"
    extra = [*FAST, "--http", http]
    with contextlib.ExitStack() as stack:
        kwargs: dict[str, Any] = {}
        if name == "s3":
            from tests.fixtures.s3 import create_bucket, run_seaweedfs

            endpoint = stack.enter_context(run_seaweedfs())
            kwargs["store_url"] = endpoint.store_url(create_bucket(endpoint), "kafscale")
        b = start_broker(work / name, extra_args=tuple(extra), **kwargs)
        stack.callback(b.stop)
        yield b, f"http://{http}/metrics"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.compaction", description=__doc__.split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="64 MB instead of --mb")
    p.add_argument("--mb", type=float, default=1024.0, help="MB of keyed updates (default 1024)")
    p.add_argument("--keys", type=int, default=10_000, help="distinct keys (default 10000)")
    p.add_argument("--value-bytes", type=int, default=1024, help="value size (default 1024)")
    p.add_argument("--targets", default="local,s3", help="local,s3")
    p.add_argument("--rate", type=float, default=2000.0, help="paced produce msg/s (2000)")
    args = p.parse_args(argv)
    if args.quick:
        args.mb = 64.0
    lines = []
    with tempfile.TemporaryDirectory(prefix="bench-compaction-", dir=bench_dir()) as tmp:
        for name in args.targets.split(","):
            with target(name, Path(tmp)) as (b, metrics):
                c = compaction_run(b, metrics, args)
                lines.append(
                    f"{name:5} compaction: log {c['log_mb']:.0f} MB -> {c['out_mb']:.1f} MB in "
                    f"{c['seconds']:.2f} s: {c['log_mb_s']:.1f} MB/s of log, "
                    f"{c['read_mb_s']:.1f} MB/s read (key map + rewrite)"
                )
                print(lines[-1], flush=True)
                for label, configs, rate, mb in (
                    ("delete", {"cleanup.policy": "delete"}, 0.0, args.mb),
                    ("compact, no pass (keyless check only)", LAGGED, 0.0, args.mb),
                    ("compact, passes running", RUNNING, 0.0, args.mb),
                    ("delete", {"cleanup.policy": "delete"}, args.rate, args.mb / 4),
                    ("compact, passes running", RUNNING, args.rate, args.mb / 4),
                ):
                    topic = f"prod-{uuid.uuid4().hex[:6]}"
                    _create(b.bootstrap, topic, configs)
                    passes0 = _scrape(metrics).get("kafscale_compaction_passes_total", 0.0)
                    mbs, p99 = produce(b.bootstrap, topic, mb, args.keys, args.value_bytes, rate)
                    passes = _scrape(metrics).get("kafscale_compaction_passes_total", 0.0) - passes0
                    pace = f"{rate:.0f} msg/s" if rate else "full speed"
                    lines.append(
                        f"{name:5} produce {pace:>11}, {label:38}: {mbs:6.1f} MB/s, "
                        f"p99 {p99:7.1f} ms ({passes:.0f} compaction passes meanwhile)"
                    )
                    print(lines[-1], flush=True)
    print("\nsummary\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
