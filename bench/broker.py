"""Data-plane benchmark: this broker (local store, SeaweedFS S3) versus librdkafka's mock.

Run ``python -m bench.broker [--quick]`` from the repository root (``--help`` for more).
For every target it measures, with confluent-kafka and 1 KiB values, acks=all:

- produce throughput (MB/s, msg/s) and per-message delivery-report latency (p50/p99),
  without and with idempotence (the Java client's default), at full speed;
- produce latency at a fixed, moderate rate (idempotent), where queueing does not dominate;
- consume throughput (MB/s, msg/s) from the beginning of the produced data;
- for the broker targets: the broker's RSS (``/proc/PID/status``) sampled through the
  whole run, against its configured buffer limits (broker in-flight bytes + cache bytes),
  and the peaks of its ``/metrics`` gauges.

Each producer and consumer runs in its own process (``python -m bench.broker worker
SPEC``) so the clients never share a GIL with each other or with the orchestrator. The
mock cluster lives in a producer of a separate host process (``test.mock.num.brokers``);
its bootstrap address is read from that client's metadata and the load workers connect
to it exactly as they connect to the broker. MB means 10^6 bytes of message values.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MSG_SIZE = 1024
MB = 1_000_000
MIB = 1 << 20
WORKER_TIMEOUT = 300.0
TARGETS = ("local", "noval", "s3", "mock")


@dataclass(frozen=True, slots=True)
class Plan:
    messages: int  # per full-speed run (produce, idempotent produce, consume)
    paced_rate: int  # msg/s of the paced latency run
    paced_seconds: float
    partitions: int
    compression: str = "none"  # producers' compression.type


QUICK = Plan(messages=60_000, paced_rate=2_000, paced_seconds=3.0, partitions=1)
FULL = Plan(messages=150_000, paced_rate=2_000, paced_seconds=5.0, partitions=1)


@dataclass(frozen=True, slots=True)
class BrokerLimits:
    cache_bytes: int = 64 * MIB
    broker_inflight_bytes: int = 64 * MIB
    connection_inflight_bytes: int = 32 * MIB

    def args(self) -> list[str]:
        return [
            "--cache-bytes", str(self.cache_bytes),
            "--broker-inflight-bytes", str(self.broker_inflight_bytes),
            "--connection-inflight-bytes", str(self.connection_inflight_bytes),
        ]  # fmt: skip


# ------------------------------------------------------------------------------ workers


def _percentile(ordered: list[float], q: float) -> float:
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _produce(spec: dict[str, Any]) -> dict[str, Any]:
    from confluent_kafka import Producer

    latencies: list[float] = []
    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            latencies.append(msg.latency() or 0.0)

    producer = Producer(
        {
            "bootstrap.servers": spec["bootstrap"],
            "acks": "all",
            "enable.idempotence": bool(spec["idempotence"]),
            "linger.ms": 5,
            "message.timeout.ms": int(WORKER_TIMEOUT * 1000),
            "log_level": 3,
            "compression.type": spec.get("compression", "none"),
        }
    )
    topic, count, rate = spec["topic"], int(spec["messages"]), float(spec.get("rate", 0))
    partitions = int(spec["partitions"])
    size = int(spec["size"])
    payload = os.urandom(size)
    if spec.get("compression", "none") != "none":  # half random: compressible ~2:1
        payload = payload[: size // 2] + bytes(size - size // 2)
    producer.produce(topic, payload, partition=0)  # connect (and get a producer id) first
    producer.flush(30)
    latencies.clear()
    start = time.perf_counter()
    for i in range(count):
        if rate:
            while (wait := start + i / rate - time.perf_counter()) > 0:
                producer.poll(wait)
        while True:
            try:
                producer.produce(topic, payload, partition=i % partitions, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.005)
        if not i & 255:
            producer.poll(0)
    unsent = producer.flush(WORKER_TIMEOUT)
    elapsed = time.perf_counter() - start
    latencies.sort()
    return {
        "messages": len(latencies),
        "bytes": len(latencies) * len(payload),
        "seconds": elapsed,
        "errors": len(errors) + unsent,
        "first_error": errors[0] if errors else None,
        "p50_ms": _percentile(latencies, 0.50) * 1000,
        "p99_ms": _percentile(latencies, 0.99) * 1000,
    }


def _window(consumer: Any, topic: str, partitions: int) -> int:
    """(Re-)assign every partition at its log start; the messages up to the log end."""
    from confluent_kafka import TopicPartition

    tps, total = [], 0
    for p in range(partitions):
        lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
        tps.append(TopicPartition(topic, p, lo))
        total += hi - lo
    consumer.assign(tps)
    return total


def _consume(spec: dict[str, Any]) -> dict[str, Any]:
    """Read ``messages`` from the beginning. With ``rewind`` (the mock, which keeps only
    ~5 MB per partition) the retained window is read again and again until then."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": spec["bootstrap"],
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "log_level": 3,
            # rewinding: the watermark query waits behind an idle long poll at the log end
            **({"fetch.wait.max.ms": 5} if spec.get("rewind") else {}),
        }
    )
    topic, count, rewind = spec["topic"], int(spec["messages"]), bool(spec.get("rewind"))
    partitions = int(spec["partitions"])
    got = nbytes = errors = rewinds = 0
    window = _window(consumer, topic, partitions)
    start = time.perf_counter()
    deadline = start + WORKER_TIMEOUT
    first_at, first_n, first_b = 0.0, 0, 0
    while got < count and time.perf_counter() < deadline:
        if rewind and window <= 0:
            window, rewinds = _window(consumer, topic, partitions), rewinds + 1
        # ask for no more than is there: consume() waits out its timeout when short
        for m in consumer.consume(min(10_000, count - got, window if rewind else count), 1.0):
            if m.error() is not None:
                errors += 1
                continue
            got += 1
            window -= 1
            nbytes += len(m.value() or b"")
        if got and not first_at:  # steady state is timed from the first batch on
            first_at, first_n, first_b = time.perf_counter(), got, nbytes
    end = time.perf_counter()
    consumer.close()
    return {
        "messages": got,
        "bytes": nbytes,
        "seconds": end - start,
        "steady_messages": got - first_n,
        "steady_bytes": nbytes - first_b,
        "steady_seconds": end - first_at if first_at else 0.0,
        "errors": errors,
        "rewinds": rewinds,
    }


def _host_mock() -> None:
    """Hold a librdkafka mock cluster; print its bootstrap; live until stdin closes."""
    from confluent_kafka import Producer

    holder = Producer({"test.mock.num.brokers": 1, "log_level": 3})
    brokers = holder.list_topics(timeout=30).brokers
    b = next(iter(brokers.values()))
    print(json.dumps({"bootstrap": f"{b.host}:{b.port}"}), flush=True)
    sys.stdin.read()


def worker_main(spec: dict[str, Any]) -> int:
    kind = spec["kind"]
    if kind == "mock":
        _host_mock()
        return 0
    result = _produce(spec) if kind == "produce" else _consume(spec)
    print(json.dumps(result), flush=True)
    return 0


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.broker", "worker", json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=WORKER_TIMEOUT + 60)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {spec['kind']} failed:\n{proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


# ------------------------------------------------------------------------------ targets


@dataclass
class Target:
    name: str
    bootstrap: str
    pid: int | None = None  # the broker process (RSS sampling, profiling)
    metrics_url: str | None = None
    limit_bytes: int = 0  # broker in-flight + cache bytes


@dataclass
class Sampler:
    """Samples a process's RSS (every 0.1 s) and the broker's /metrics (every 0.5 s)."""

    pid: int
    metrics_url: str | None
    baseline_rss: int = 0
    max_rss: int = 0
    peaks: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Sampler:
        self.baseline_rss = _status_bytes(self.pid, "VmRSS")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def hwm(self) -> int:
        return _status_bytes(self.pid, "VmHWM")

    def _run(self) -> None:
        tick = 0
        while not self._stop.wait(0.1):
            self.max_rss = max(self.max_rss, _status_bytes(self.pid, "VmRSS"))
            tick += 1
            if self.metrics_url and tick % 5 == 0:
                for name, value in _scrape(self.metrics_url).items():
                    self.peaks[name] = max(self.peaks.get(name, 0.0), value)


def _status_bytes(pid: int, field_name: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process and its reaped children (all threads)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return sum(int(v) for v in fields[11:13]) / os.sysconf("SC_CLK_TCK")


GAUGES = ("kafscale_inflight_bytes", "kafscale_pending_bytes", "kafscale_segment_cache_bytes")
LEASE_GAP = "kafscale_lease_refresh_gap_max_seconds"  # keep-alive starvation under load


def _scrape(url: str) -> dict[str, float]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in GAUGES or name == LEASE_GAP:
            out[name] = float(value)
    return out


@contextlib.contextmanager
def broker_target(
    name: str, workdir: Path, store_url: str | None, limits: BrokerLimits, extra: list[str]
) -> Iterator[Target]:
    """A broker process; target ``noval`` runs it without full produce validation
    (``bench.noval_broker``: the internal ``BrokerConfig.validate_records`` switched off)."""
    from tests.fixtures.broker import free_port, start_broker

    http = free_port()
    args = ["--http", f"127.0.0.1:{http}", "--log-level", "WARNING", *limits.args(), *extra]
    module = "bench.noval_broker" if name == "noval" else "broker.cli"
    broker = start_broker(workdir, store_url=store_url, extra_args=tuple(args), module=module)
    try:
        yield Target(
            name,
            broker.bootstrap,
            broker.pid,
            f"http://127.0.0.1:{http}/metrics",
            limits.broker_inflight_bytes + limits.cache_bytes,
        )
    finally:
        broker.stop()


@contextlib.contextmanager
def s3_target(workdir: Path, limits: BrokerLimits, extra: list[str]) -> Iterator[Target]:
    from tests.fixtures.s3 import create_bucket, run_seaweedfs

    with run_seaweedfs() as endpoint:
        bucket = create_bucket(endpoint)
        url = endpoint.store_url(bucket, "bench")
        with broker_target("s3", workdir, url, limits, extra) as target:
            yield target


@contextlib.contextmanager
def mock_target() -> Iterator[Target]:
    spec = json.dumps({"kind": "mock"})
    cmd = [sys.executable, "-m", "bench.broker", "worker", spec]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("mock cluster host exited at start")
        yield Target("mock", json.loads(line)["bootstrap"], proc.pid)
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)


# ------------------------------------------------------------------------------ running


@contextlib.contextmanager
def profiled(target: Target, phase: str, outdir: Path | None) -> Iterator[None]:
    """With ``outdir``, record the broker with py-spy (collapsed stacks) during a phase."""
    if outdir is None or target.pid is None or target.name == "mock":
        yield
        return
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out = outdir / f"{target.name}-{phase}.txt"
    cmd = [spy, "record", "--pid", str(target.pid), "--rate", "200", "--format", "raw",
           "--output", str(out), "--nonblocking"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)  # let py-spy attach before the load starts
    try:
        yield
    finally:
        os.kill(proc.pid, signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)


def create_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    """CreateTopics on the broker. (The mock cluster has no controller to answer it; it
    auto-creates topics with 4 partitions, of which the workers use ``partitions``.)"""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    futures = admin.create_topics([NewTopic(n, partitions, 1) for n in names])
    for fut in futures.values():
        fut.result(30)


PHASES = ("produce", "produce_idem", "paced", "consume")


def _phase_specs(target: Target, plan: Plan, run: str) -> dict[str, dict[str, Any]]:
    topics = {k: f"bench-{k}-{run}" for k in ("produce", "idem", "paced")}
    if target.name != "mock":
        create_topics(target.bootstrap, list(topics.values()), plan.partitions)
    base = {"bootstrap": target.bootstrap, "size": MSG_SIZE, "partitions": plan.partitions,
            "compression": plan.compression}  # fmt: skip
    specs: dict[str, dict[str, Any]] = {
        "produce": {"kind": "produce", "topic": topics["produce"], "messages": plan.messages,
                    "idempotence": False},
        "produce_idem": {"kind": "produce", "topic": topics["idem"], "messages": plan.messages,
                         "idempotence": True},
        "paced": {"kind": "produce", "topic": topics["paced"], "idempotence": True,
                  "messages": int(plan.paced_rate * plan.paced_seconds), "rate": plan.paced_rate},
        "consume": {"kind": "consume", "topic": topics["produce"], "messages": plan.messages,
                    "rewind": target.name == "mock"},
    }  # fmt: skip
    return {k: {**base, **v} for k, v in specs.items()}


def _warm_up(target: Target, plan: Plan) -> None:
    topic = f"bench-warm-{uuid.uuid4().hex[:6]}"
    if target.name != "mock":
        create_topics(target.bootstrap, [topic], plan.partitions)
    base = {"bootstrap": target.bootstrap, "size": MSG_SIZE, "partitions": plan.partitions}
    run_worker({**base, "kind": "produce", "topic": topic, "messages": 2000, "idempotence": True})
    run_worker({**base, "kind": "consume", "topic": topic, "messages": 2000})


def _run_phase(target: Target, phase: str, spec: dict[str, Any], spy: Path | None) -> Any:
    cpu = _cpu_seconds(target.pid)
    with profiled(target, phase, spy):
        res = run_worker(spec)
    res["server_cpu_s"] = _cpu_seconds(target.pid) - cpu
    print(f"  {target.name:<6} {phase:<13} {_brief(res)}", flush=True)
    return res


def _median(trials: list[dict[str, Any]], phase: str) -> dict[str, Any]:
    """The trial with the median figure (throughput; p50 for the paced run)."""
    key = (lambda r: r["p50_ms"]) if phase == "paced" else (lambda r: _rate(r, True)[0])
    return sorted(trials, key=key)[len(trials) // 2]


def run_targets(
    targets: list[Target], plan: Plan, rounds: int, spy_dir: Path | None
) -> dict[str, dict[str, Any]]:
    """Every phase on every target in turn (so they share the machine's noise alike),
    ``rounds`` times; per target and phase the median trial is kept."""
    for t in targets:  # load lazily imported code (the S3 client) before the baseline
        _warm_up(t, plan)
    samplers = {t.name: Sampler(t.pid, t.metrics_url).start()
                for t in targets if t.pid and t.metrics_url}  # fmt: skip
    trials: dict[str, dict[str, list[Any]]] = {t.name: {p: [] for p in PHASES} for t in targets}
    try:
        for r in range(rounds):
            print(f"== round {r + 1}/{rounds}", flush=True)
            specs = {t.name: _phase_specs(t, plan, f"{r}-{uuid.uuid4().hex[:6]}") for t in targets}
            for phase in PHASES:
                for t in targets:
                    trials[t.name][phase].append(
                        _run_phase(t, phase, specs[t.name][phase], spy_dir)
                    )
    finally:
        for sampler in samplers.values():
            sampler.stop()
    results: dict[str, dict[str, Any]] = {}
    for t in targets:
        results[t.name] = {p: _median(trials[t.name][p], p) for p in PHASES}
        results[t.name]["trials"] = trials[t.name]
        if (sm := samplers.get(t.name)) is not None:
            results[t.name]["memory"] = {
                "baseline_rss": sm.baseline_rss,
                "max_rss": max(sm.max_rss, sm.baseline_rss),
                "hwm_rss": sm.hwm(),
                "limit_bytes": t.limit_bytes,
                "peaks": sm.peaks,
            }
    return results


def _rate(res: dict[str, Any], steady: bool = False) -> tuple[float, float]:
    prefix = "steady_" if steady and res.get("steady_seconds") else ""
    secs = res[prefix + "seconds"] or math.nan
    return res[prefix + "bytes"] / secs / MB, res[prefix + "messages"] / secs


def _brief(res: dict[str, Any]) -> str:
    mbs, msgs = _rate(res, steady=True)
    text = f"{mbs:8.1f} MB/s {msgs:10.0f} msg/s  ({res['messages']} msgs, {res['errors']} errors)"
    if res.get("server_cpu_s") and res["bytes"]:
        text += f"  server CPU {res['server_cpu_s'] * 1000 / (res['bytes'] / MB):.1f} ms/MB"
    if "p50_ms" in res:
        text += f"  p50 {res['p50_ms']:.1f} ms  p99 {res['p99_ms']:.1f} ms"
    return text


# ------------------------------------------------------------------------------ report

ROWS: list[tuple[str, str, str]] = [
    # label, phase, metric
    ("produce MB/s (acks=all)", "produce", "mbs"),
    ("produce msg/s", "produce", "msgs"),
    ("produce p50 ms (saturated)", "produce", "p50_ms"),
    ("produce p99 ms (saturated)", "produce", "p99_ms"),
    ("idempotent produce MB/s", "produce_idem", "mbs"),
    ("idempotent produce msg/s", "produce_idem", "msgs"),
    ("idempotent p50 ms (saturated)", "produce_idem", "p50_ms"),
    ("idempotent p99 ms (saturated)", "produce_idem", "p99_ms"),
    ("paced p50 ms", "paced", "p50_ms"),
    ("paced p99 ms", "paced", "p99_ms"),
    ("consume MB/s", "consume", "mbs"),
    ("consume msg/s", "consume", "msgs"),
]


def _metric(results: dict[str, Any], phase: str, metric: str) -> float:
    res = results.get(phase)
    if res is None:
        return math.nan
    if metric in ("mbs", "msgs"):
        mbs, msgs = _rate(res, steady=phase == "consume")
        return mbs if metric == "mbs" else msgs
    return float(res[metric])


def _fmt(v: float) -> str:
    if math.isnan(v):
        return "-"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.2f}" if abs(v) < 10 else f"{v:.1f}"


def format_table(all_results: dict[str, dict[str, Any]], plan: Plan) -> str:
    names = [t for t in TARGETS if t in all_results]
    brokers = [t for t in names if t != "mock"]
    ratios = [f"{t}/mock" for t in brokers] if "mock" in names else []
    head = ["metric", *names, *ratios]
    rows = [head]
    for label, phase, metric in ROWS:
        vals = [_metric(all_results[t], phase, metric) for t in names]
        row = [label, *(_fmt(v) for v in vals)]
        if ratios:
            mock = _metric(all_results["mock"], phase, metric)
            row += [_fmt(_metric(all_results[t], phase, metric) / mock) if mock else "-"
                    for t in brokers]  # fmt: skip
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [
        f"{plan.messages} x {MSG_SIZE} B values per full-speed run, {plan.partitions} "
        f"partition(s), paced run {plan.paced_rate} msg/s for {plan.paced_seconds:g} s; "
        "MB = 10^6 B"
    ]
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(widths[j]) if j == 0 else c.rjust(widths[j])
                               for j, c in enumerate(r)))  # fmt: skip
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    for t in brokers:
        lines.append(_memory_line(t, all_results[t].get("memory")))
    return "\n".join(lines)


def _memory_line(name: str, mem: dict[str, Any] | None) -> str:
    if not mem:
        return f"{name}: no memory samples"
    m = {k: v / MIB for k, v in mem.items() if isinstance(v, int | float)}
    peaks = ", ".join(f"{k.removeprefix('kafscale_')} {v / MIB:.1f}"
                      for k, v in sorted(mem["peaks"].items()) if k != LEASE_GAP)  # fmt: skip
    gap = mem["peaks"].get(LEASE_GAP)
    growth = m["max_rss"] - m["baseline_rss"]
    verdict = "within" if growth <= m["limit_bytes"] else "OVER"
    return (
        f"{name} broker RSS MiB: baseline {m['baseline_rss']:.0f}, max sampled "
        f"{m['max_rss']:.0f}, peak (VmHWM) {m['hwm_rss']:.0f}; growth {growth:.0f} {verdict} "
        f"limits {m['limit_bytes']:.0f} (in-flight + cache); gauge peaks MiB: {peaks}"
        + (f"; worst lease keep-alive gap {gap:.2f} s" if gap is not None else "")
    )


# ------------------------------------------------------------------------------ main


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.broker", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="~1 minute run (smaller volumes)")
    p.add_argument("--targets", default="local,s3,mock", help="subset of local,noval,s3,mock")
    p.add_argument("--messages", type=int, help="messages per full-speed run")
    p.add_argument("--rounds", type=int, help="rounds (median kept); default 1 quick, 3 full")
    p.add_argument("--partitions", type=int, help="partitions per topic (default 1)")
    p.add_argument("--compression", default="none",
                   help="producers' compression.type (values then half random)")  # fmt: skip
    p.add_argument("--cache-bytes", type=int, default=64 * MIB)
    p.add_argument("--broker-inflight-bytes", type=int,
                   default=64 * MIB)  # fmt: skip
    p.add_argument(
        "--broker-arg",
        action="append",
        default=[],
        help="extra flag for both broker targets, e.g. --broker-arg=--flush-bytes=N",
    )
    p.add_argument("--local-arg", action="append", default=[], help="extra flag, local only")
    p.add_argument("--s3-arg", action="append", default=[], help="extra flag, S3 only")
    p.add_argument("--json", type=Path, help="also write the raw results here")
    p.add_argument(
        "--py-spy",
        type=Path,
        metavar="DIR",
        help="profile the broker per phase with py-spy into DIR (collapsed stacks)",
    )
    return p  # fmt: skip


def _open_target(
    name: str, stack: contextlib.ExitStack, workdir: Path, limits: BrokerLimits,
    args: argparse.Namespace,
) -> Target:  # fmt: skip
    if name == "mock":
        return stack.enter_context(mock_target())
    if name == "s3":
        return stack.enter_context(
            s3_target(workdir / "s3", limits, [*args.broker_arg, *args.s3_arg])
        )
    extra = [*args.broker_arg, *args.local_arg]
    return stack.enter_context(broker_target(name, workdir / name, None, limits, extra))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["worker"]:
        return worker_main(json.loads(argv[1]))
    args = _parser().parse_args(argv)
    plan = QUICK if args.quick else FULL
    plan = Plan(
        args.messages or plan.messages, plan.paced_rate, plan.paced_seconds,
        args.partitions or plan.partitions, args.compression,
    )  # fmt: skip
    if not 1 <= plan.partitions <= 4:
        raise SystemExit("--partitions must be 1..4 (the mock cluster's topics have 4)")
    limits = BrokerLimits(args.cache_bytes, args.broker_inflight_bytes)
    names = [t.strip() for t in args.targets.split(",") if t.strip()]
    if unknown := set(names) - set(TARGETS):
        raise SystemExit(f"unknown targets: {sorted(unknown)}")
    if args.py_spy is not None:
        args.py_spy.mkdir(parents=True, exist_ok=True)
    rounds = args.rounds or (1 if args.quick else 3)
    workdir = Path(tempfile.mkdtemp(prefix="kafscale-bench-"))
    try:
        with contextlib.ExitStack() as stack:
            targets = [_open_target(n, stack, workdir, limits, args) for n in names]
            results = run_targets(targets, plan, rounds, args.py_spy)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(format_table(results, plan))
    if args.json is not None:
        args.json.write_text(json.dumps({"plan": plan.__repr__(), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
