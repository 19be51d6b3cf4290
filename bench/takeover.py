"""What a partition's takeover reads: the idempotent-producer state a new owner needs
before it serves (docs/architecture.md, "Idempotent producers"), after a clean hand-off
and after a crash, measured in the same run for this tree and, with ``--base-tree``,
another source tree.

``python -m bench.takeover [--mb N] [--partitions P] [--base-tree DIR]``: per tree, a
broker on the local store and the embedded metadata store; an idempotent
confluent-kafka producer writes ``N`` MiB of 1 KiB records spread over ``P`` partitions
(acks=all), the broker merges its small segments for a few seconds, then it stops:

- ``hand-off``: SIGTERM (it flushes and gives its owner keys back);
- ``crash``: SIGKILL (its owner keys stay; the broker started again has the same node
  id and takes them at once, docs/architecture.md, "Ownership").

The broker is started again on the same directories and a new producer writes one
record to each partition: the time from the first produce to the last delivery (each
partition's take, rebuild included, then one flush cycle) and the bytes the broker read
from the store meanwhile (``kafscale_store_bytes_total{op="get"}``). Processes are
stopped by PID.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.broker_run import create_topics
from bench.broker_targets import broker_env
from bench.fs_probe import new_workdir

if TYPE_CHECKING:
    from tests.fixtures.broker import BrokerProcess

MSG = 1024
SETTLE_S = 8.0  # merges of the produce's small segments (merge interval 1 s)


def _producer(bootstrap: str) -> Any:
    from confluent_kafka import Producer

    return Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
         "log_level": 3}
    )  # fmt: skip


def _fill(bootstrap: str, topic: str, partitions: int, mib: int) -> None:
    p = _producer(bootstrap)
    value = os.urandom(MSG)
    for i in range(mib * 1024):
        while True:
            try:
                p.produce(topic, value, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    left = p.flush(120)
    if left:
        raise RuntimeError(f"{left} records not delivered")


def metric(metrics_url: str, series: str) -> float | None:
    """The value of one series (name and labels, as exposed) of ``/metrics``; None when
    the broker does not export it."""
    with urllib.request.urlopen(metrics_url, timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(series + " "):
                return float(line.rsplit(" ", 1)[1])
    return None


def _get_bytes(metrics_url: str) -> float:
    return metric(metrics_url, 'kafscale_store_bytes_total{op="get"}') or 0.0


def _first_produce(bootstrap: str, topic: str, partitions: int) -> float:
    """Seconds from the first produce to the last delivery, one record per partition."""
    p = _producer(bootstrap)
    failed: list[str] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    start = time.monotonic()
    for part in range(partitions):
        p.produce(topic, b"after", partition=part, on_delivery=report)
    left = p.flush(120)
    took = time.monotonic() - start
    if left or failed:
        raise RuntimeError(f"takeover produce: {left} undelivered, errors {failed[:3]}")
    return took


def local_broker(
    tree: Path | None, prefix: str, extra: Sequence[str] = ()
) -> tuple[BrokerProcess, str, Path]:
    """A broker process of ``tree`` (None: this one) on the local store and the embedded
    metadata store in a fresh directory, with ``/metrics``: (process, its metrics URL,
    the directory). The caller stops it by PID and removes the directory."""
    from tests.fixtures.broker import BrokerProcess, free_port

    workdir = new_workdir(prefix)
    port, http = free_port(), free_port()
    args = ["--listen", f"127.0.0.1:{port}", "--http", f"127.0.0.1:{http}",
            "--node-id", "0", "--workers", "1", "--log-level", "WARNING", *extra]  # fmt: skip
    broker = BrokerProcess(workdir, port, args, broker_env(tree)).start()
    return broker, f"http://127.0.0.1:{http}/metrics", workdir


def run_tree(tree: Path | None, mode: str, mib: int, partitions: int) -> dict[str, float]:
    broker, metrics, workdir = local_broker(tree, "takeover-")
    topic = "takeover"
    try:
        create_topics(broker.bootstrap, [topic], partitions)
        _fill(broker.bootstrap, topic, partitions, mib)
        time.sleep(SETTLE_S)  # let maintenance merge (a bench phase, not a test wait)
        if mode == "crash":
            broker.kill9()
        else:
            broker.stop()
        broker.start()
        before = _get_bytes(metrics)
        took = _first_produce(broker.bootstrap, topic, partitions)
        read = _get_bytes(metrics) - before
    finally:
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return {"seconds": took, "read_mib": read / (1 << 20)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.takeover", description=__doc__)
    p.add_argument("--mb", type=int, default=64, help="MiB produced before the move")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--base-tree", type=Path, help="another source tree, measured alongside")
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args(argv)
    trees: list[tuple[str, Path | None]] = [("this tree", None)]
    if args.base_tree is not None:
        trees.append(("base", args.base_tree))
    for rnd in range(1, args.rounds + 1):
        for mode in ("hand-off", "crash"):
            for name, tree in trees:
                r = run_tree(tree, mode, args.mb, args.partitions)
                print(
                    f"round {rnd} {mode:8} {name:9}: takeover {r['seconds'] * 1000:8.1f} ms"
                    f"  read {r['read_mib']:7.1f} MiB  ({args.mb} MiB in {args.partitions}"
                    " partitions)",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
