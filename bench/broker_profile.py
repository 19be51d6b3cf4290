"""Profile of the local-store broker under produce load: the top of a py-spy profile.

    python -m bench.broker_profile [--messages 300000] [--modes plain,idem] [--native]
                                   [--top 15] [--keep DIR] [--base-tree DIR]
                                   [--partitions 1] [--rate MSGS_PER_S]
                                   [--warm-messages 100000] [--client java]

Starts one broker (local store, embedded metadata; from ``--base-tree`` if given),
produces ``--messages`` x 1 KiB with confluent-kafka (or ``--client java``: kafka-clients'
producer; acks=all, over ``--partitions``, which the broker takes first, unmeasured;
``idem`` with idempotence) while py-spy samples the broker at 250 Hz (every thread, idle
ones left out; ``--native`` adds C frames; ``--perf``: ``perf record -g`` instead, CPU only,
kernel and native frames included), and prints per mode the server CPU per MB and the
top functions: by *self* samples (the function on top of the stack) and by *total*
samples (the function anywhere on it). Before the first mode, ``--warm-messages`` of it
are produced unmeasured, so that no mode pays the heap's growth. py-spy is not a project
dependency: ``pip install py-spy`` into the venv to use this. docs/benchmarks.md,
"Round 3: produce profile".
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from bench.broker_run import MSG_SIZE, create_topics, take_partitions, warm_up
from bench.broker_run import QUICK as PLAN
from bench.broker_targets import (
    BrokerLimits,
    Target,
    base_target,
    broker_target,
    cpu_seconds,
    py_spy,
)
from bench.broker_workers import run_worker
from bench.fs_probe import new_workdir

#: messages of the first mode produced unmeasured first (~100 MB: past the default cache
#: and in-flight limits, so the heap has its working size)
WARM_MESSAGES = 100_000
GIL_ONLY = False  # --gil: only the thread holding the GIL (the Python CPU)
_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<where>[^()]*?)(?::\d+)?\)$")


def _function(frame: str) -> str:
    """``name (path:line)`` -> ``name (path)``: samples add up per function, not per line."""
    m = _FRAME.match(frame.strip())
    if m is None:
        return frame.strip()
    where = m.group("where")
    for marker in ("site-packages/", "lib/python3.11/"):
        if marker in where:
            where = where.split(marker, 1)[1]
    return f"{m.group('fn')} ({where})"


def summarize(raw: str, top: int) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """(samples, top by self, top by total) of py-spy's raw (collapsed) output."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        samples += n
        frames = [_function(f) for f in stack.split(";") if f.strip()]
        if not frames:
            continue
        own[frames[-1]] += n
        for fn in set(frames):
            total[fn] += n
    skip = ("_run_module_as_main", "_run_code", "<module>", "main ", "run_guarded", "run (",
            "Runner.run", "main.<locals>", "_bootstrap", "Thread.run", "_worker (")  # fmt: skip
    tops = [(fn, n) for fn, n in total.most_common() if not fn.startswith(skip)]
    return samples, own.most_common(top), tops[:top]


def format_profile(title: str, raw: str, top: int) -> str:
    samples, own, tot = summarize(raw, top)
    lines = [f"{title}: {samples} samples"]
    for label, rows in (("self", own), ("total", tot)):
        lines.append(f"  top {len(rows)} by {label} samples:")
        lines += [f"    {100 * n / max(samples, 1):5.1f} %  {fn}" for fn, n in rows]
    return "\n".join(lines)


@contextlib.contextmanager
def _spy(pid: int, out: Path, native: bool) -> Iterator[None]:
    cmd = [py_spy(), "record", "--pid", str(pid), "--rate", "250", "--format", "raw",
           "--output", str(out)]  # fmt: skip
    if native:
        cmd.append("--native")
    if GIL_ONLY:
        cmd.append("--gil")
    else:
        cmd.append("--nonblocking")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # let py-spy attach before the load starts
    try:
        yield
    finally:
        os.kill(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def _perf(pid: int, out: Path) -> Iterator[None]:
    perf = shutil.which("perf")
    if perf is None:
        raise SystemExit("perf not found: install linux-perf (perf record/report)")
    cmd = [perf, "record", "-F", "499", "-g", "-p", str(pid), "-o", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    try:
        yield
    finally:
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(60)


def perf_top(out: Path, top: int) -> str:
    """perf's self-time top, by shared object + symbol and by shared object alone."""
    lines = []
    for sort in ("dso", "dso,sym"):
        rep = subprocess.run(
            ["perf", "report", "-i", str(out), "--no-children", "--sort", sort, "--stdio",
             "-g", "none", "--percent-limit", "0.5"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        rows = [ln for ln in rep.stdout.splitlines() if ln.strip() and not ln.startswith("#")]
        lines.append(f"  top {min(top, len(rows))} by {sort} (perf, self CPU):")
        lines += ["   " + " ".join(r.split()) for r in rows[:top]]
    return "\n".join(lines)


def minor_faults(pid: int) -> int:
    """Minor page faults of a process so far (``/proc/PID/stat``, all threads)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[7])


def profile_mode(
    t: Target,
    mode: str,
    messages: int,
    out: Path,
    native: bool | str,
    partitions: int = 1,
    rate: float | None = None,
    client: str = "librdkafka",
) -> str:
    """One mode's profile; ``client`` ``java``: the Java client (bench/java_client.py)
    produces instead of librdkafka (``rate`` does not apply to it)."""
    run = run_worker
    if client == "java":
        from bench.java_client import run_java as run
    topic = f"prof-{mode}-{uuid.uuid4().hex[:6]}"
    create_topics(t.bootstrap, [topic], partitions)
    spec = {"bootstrap": t.bootstrap, "size": MSG_SIZE, "partitions": partitions,
            "kind": "produce",
            "topic": topic, "messages": messages, "idempotence": mode == "idem"}  # fmt: skip
    if rate:
        spec["rate"] = rate
    # the broker takes the partitions first, unmeasured, as the partition sweep does: the
    # profile is of produce to N active partitions, not of their takeover
    take_partitions(run, spec, [t])
    assert t.pid is not None
    with _perf(t.pid, out) if native == "perf" else _spy(t.pid, out, bool(native)):
        before, faults = cpu_seconds(t.pid), minor_faults(t.pid)
        res = run(spec)
        cpu, faults = cpu_seconds(t.pid) - before, minor_faults(t.pid) - faults
    mb = res["bytes"] / 1e6
    return (
        f"{mode}: {messages} x {MSG_SIZE} B over {partitions} partition(s) ({client}), "
        f"{mb / res['seconds']:.1f} MB/s, "
        f"server CPU {1000 * cpu / mb:.2f} ms/MB (profiler attached), "
        f"{faults / mb:.0f} minor page faults per MB, "
        f"load average {os.getloadavg()[0]:.1f}"
    )


def warm_heap(t: Target, mode: str, messages: int, partitions: int) -> None:
    """Produce ``messages`` of ``mode`` unmeasured: the broker's heap grows to its working
    size (its caches and buffers filled) before any mode is measured. Without it the first
    mode paid that growth: 199 minor page faults per MB against 0 for the next
    (docs/benchmarks.md, "Round 21")."""
    topic = f"prof-warm-{uuid.uuid4().hex[:6]}"
    create_topics(t.bootstrap, [topic], partitions)
    run_worker({"bootstrap": t.bootstrap, "size": MSG_SIZE, "partitions": partitions,
                "kind": "produce", "topic": topic, "messages": messages,
                "idempotence": mode == "idem"})  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.broker_profile", description=__doc__)
    p.add_argument("--messages", type=int, default=300_000)
    p.add_argument("--modes", default="plain,idem")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--partitions", type=int, default=1, help="partitions of the topic")
    p.add_argument("--rate", type=float, help="pace the producer at this many messages a second")
    p.add_argument("--native", action="store_true", help="py-spy --native (C frames too)")
    p.add_argument("--gil", action="store_true", help="py-spy --gil: the GIL holder only")
    p.add_argument("--perf", action="store_true", help="perf record -g instead of py-spy")
    p.add_argument("--client", choices=("librdkafka", "java"), default="librdkafka",
                   help="the producer (java: bench/java_client.py)")  # fmt: skip
    p.add_argument("--keep", type=Path, help="keep the raw py-spy output in this directory")
    p.add_argument("--base-tree", type=Path, help="profile the broker of this source tree")
    p.add_argument(
        "--warm-messages",
        type=int,
        default=WARM_MESSAGES,
        help="first produce this many of the first mode, unmeasured (0: none)",
    )
    return p


def _profile_modes(t: Target, args: argparse.Namespace, outdir: Path) -> None:
    """Each mode of ``--modes`` profiled in turn on ``t``, its report printed."""
    modes = args.modes.split(",")
    if args.warm_messages:  # the heap's growth, paid here and not by the first mode
        warm_heap(t, modes[0], args.warm_messages, args.partitions)
    native: bool | str = "perf" if args.perf else args.native
    for mode in modes:
        out = outdir / (f"{mode}.perf" if args.perf else f"{mode}.txt")
        head = profile_mode(
            t, mode, args.messages, out, native, args.partitions, args.rate, args.client
        )
        if args.perf:
            print(head + "\n" + perf_top(out, args.top), flush=True)
        else:
            print(format_profile(head, out.read_text(), args.top), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    global GIL_ONLY
    GIL_ONLY = args.gil
    workdir = new_workdir("kafscale-prof-")
    outdir = args.keep or workdir / "spy"
    outdir.mkdir(parents=True, exist_ok=True)
    limits = BrokerLimits()
    try:
        with contextlib.ExitStack() as stack:
            if args.base_tree is not None:
                t = stack.enter_context(base_target(workdir / "b", args.base_tree, limits, []))
            else:
                t = stack.enter_context(broker_target("local", workdir / "b", None, limits, []))
            warm_up(t, PLAN)
            _profile_modes(t, args, outdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
