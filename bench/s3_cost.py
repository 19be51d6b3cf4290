"""What SeaweedFS spends per MB produced through the broker, and on what
(docs/benchmarks.md, "Round 4: SeaweedFS's cost per MB").

    python -m bench.s3_cost [--messages 60000] [--modes plain,idem] [--window 15]
                            [--profile DIR] [--weed-arg=-FLAG=V ...] [--broker-arg=--FLAG=V ...]

One SeaweedFS (``weed mini`` with ``-debug``: Go's pprof endpoint) and one broker on it.
Per mode, one produce of ``--messages`` x 1 KiB to a fresh topic inside a window of
``--window`` seconds that also holds the broker's follow-up work of those bytes (its merges
and, with the short deletion grace given here, the deletes of the merged-away objects).
Printed per MB produced: SeaweedFS's CPU (``/proc``: in the produce, and in the whole
window), the broker's CPU, the broker's store calls and bytes by operation, SeaweedFS's own
request counters (S3 gateway, filer, filer store, volume server), and with ``--profile``
the top of SeaweedFS's CPU profile over the window (``bench.pprof``; saved to DIR).
"""

from __future__ import annotations

import argparse
import re
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from bench.broker_run import MSG_SIZE, create_topics
from bench.broker_targets import S3_VOLUME_MB, BrokerLimits, broker_target, cpu_seconds
from bench.broker_workers import run_worker
from bench.fs_probe import new_workdir
from bench.pprof import Profile, parse

MB = 1_000_000
DEFAULT_BROKER_ARGS = ["--segment-delete-grace-ms=3000"]  # deletes fall inside the window
_LINE = re.compile(r"^([A-Za-z_:][\w:]*)(\{[^}]*\})? (\S+)$")
# the counters worth a line: SeaweedFS's (requests by component) and the broker's store calls
COUNTERS = (
    "SeaweedFS_s3_request_total",
    "SeaweedFS_filer_request_total",
    "SeaweedFS_filerStore_request_total",
    "SeaweedFS_volumeServer_request_total",
    "go_gc_duration_seconds_count",
    "go_memstats_alloc_bytes_total",
    "kafscale_store_request_duration_seconds_count",
    "kafscale_store_bytes_total",
)
DROP_LABELS = re.compile(r',?(bucket|store)="[^"]*"')


def scrape(url: str) -> dict[str, float]:
    """The counters of ``COUNTERS`` at ``url``, keyed ``name{labels}`` (bucket dropped)."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m and m.group(1) in COUNTERS:
            labels = DROP_LABELS.sub("", m.group(2) or "").replace("{,", "{")
            name = m.group(1) + ("" if labels == "{}" else labels)
            out[name] = out.get(name, 0.0) + float(m.group(3))
    return out


def _profile(url: str, seconds: int, out: list[bytes]) -> None:
    with urllib.request.urlopen(f"{url}?seconds={seconds}", timeout=seconds + 60) as resp:
        out.append(resp.read())


def _top(prof: Profile, n: int) -> list[str]:
    lines = [f"  profile: {prof.total_ns / 1e9:.2f} CPU s sampled"]
    lines.append("  top by self:")
    for name, ns in prof.self_ns.most_common(n):
        lines.append(f"    {100 * ns / prof.total_ns:5.1f} %  {name}")
    lines.append("  top by cumulative:")
    for name, ns in prof.cum_ns.most_common(n * 2):
        lines.append(f"    {100 * ns / prof.total_ns:5.1f} %  {name}")
    return lines


def measure(
    target: Any, weed: Any, pprof_url: str | None, mode: str, messages: int, window: float
) -> dict[str, Any]:
    """One produce of ``messages`` in a window of ``window`` seconds; per-MB figures."""
    topic = f"cost-{mode}-{uuid.uuid4().hex[:6]}"
    create_topics(target.bootstrap, [topic], 1)
    before_w, before_b = scrape(weed.metrics_url), scrape(target.metrics_url)
    cpu_w, cpu_b = cpu_seconds(weed.pid), cpu_seconds(target.pid)
    raw: list[bytes] = []
    prof_thread = None
    if pprof_url is not None:
        prof_thread = threading.Thread(target=_profile, args=(pprof_url, int(window), raw))
        prof_thread.start()
    start = time.monotonic()
    spec = {"bootstrap": target.bootstrap, "size": MSG_SIZE, "partitions": 1, "kind": "produce",
            "topic": topic, "messages": messages, "idempotence": mode != "plain"}  # fmt: skip
    res = run_worker(spec)
    produce_w, produce_b = cpu_seconds(weed.pid) - cpu_w, cpu_seconds(target.pid) - cpu_b
    rest = window - (time.monotonic() - start)
    if rest > 0:
        time.sleep(rest)  # the window's tail: the broker's merges and deletes of these bytes
    if prof_thread is not None:
        prof_thread.join()
    mb = res["bytes"] / MB
    after = {**scrape(weed.metrics_url), **scrape(target.metrics_url)}
    before = {**before_w, **before_b}
    deltas = {k: v - before.get(k, 0.0) for k, v in after.items()}
    return {
        "mode": mode,
        "mb": mb,
        "mb_s": mb / res["seconds"],
        "seconds": res["seconds"],
        "overran": rest <= 0,
        "weed_ms_mb_produce": 1000 * produce_w / mb,
        "weed_ms_mb_window": 1000 * (cpu_seconds(weed.pid) - cpu_w) / mb,
        "broker_ms_mb_produce": 1000 * produce_b / mb,
        "broker_ms_mb_window": 1000 * (cpu_seconds(target.pid) - cpu_b) / mb,
        "per_mb": {k: v / mb for k, v in sorted(deltas.items()) if v},
        "profile": parse(raw[0]) if raw else None,
        "raw_profile": raw[0] if raw else None,
    }


def report(r: dict[str, Any], top: int) -> list[str]:
    lines = [
        f"== {r['mode']}: {r['mb']:.1f} MB at {r['mb_s']:.1f} MB/s ({r['seconds']:.1f} s"
        f"{', longer than the window' if r['overran'] else ''})",
        f"  SeaweedFS CPU ms/MB: produce {r['weed_ms_mb_produce']:.2f}, "
        f"window {r['weed_ms_mb_window']:.2f}; broker CPU ms/MB: produce "
        f"{r['broker_ms_mb_produce']:.2f}, window {r['broker_ms_mb_window']:.2f}",
        "  per MB produced (window):",
    ]
    lines += [f"    {v:10.3f}  {k}" for k, v in r["per_mb"].items()]
    if r["profile"] is not None:
        lines += _top(r["profile"], top)
    return lines


def main(argv: list[str] | None = None) -> int:
    from tests.fixtures.broker import free_port
    from tests.fixtures.s3 import create_bucket, run_seaweedfs

    p = argparse.ArgumentParser(prog="python -m bench.s3_cost", description=__doc__)
    p.add_argument("--messages", type=int, default=60_000)
    p.add_argument("--modes", default="plain,idem")
    p.add_argument("--window", type=float, default=15.0)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--profile", type=Path, help="profile SeaweedFS, save the profiles here")
    p.add_argument("--weed-arg", action="append", default=[])
    p.add_argument("--broker-arg", action="append", default=None)
    args = p.parse_args(argv)
    broker_args = DEFAULT_BROKER_ARGS if args.broker_arg is None else args.broker_arg
    weed_args = list(args.weed_arg)
    pprof_url = None
    if args.profile is not None:
        port = free_port()
        weed_args += ["-debug", f"-debug.port={port}"]
        pprof_url = f"http://127.0.0.1:{port}/debug/pprof/profile"
        args.profile.mkdir(parents=True, exist_ok=True)
    workdir = new_workdir("kafscale-s3-cost-")
    print(f"weed flags {weed_args}, broker flags {broker_args}", flush=True)
    with run_seaweedfs(S3_VOLUME_MB, weed_args) as weed:
        url = weed.store_url(create_bucket(weed), "bench")
        with broker_target("s3", workdir, url, BrokerLimits(), broker_args) as target:
            measure(target, weed, None, "idem", 2000, 0)  # warm up
            for rnd in range(args.rounds):
                for mode in args.modes.split(","):
                    r = measure(target, weed, pprof_url, mode, args.messages, args.window)
                    print("\n".join(report(r, args.top)), flush=True)
                    if args.profile is not None and r["raw_profile"]:
                        (args.profile / f"weed-{mode}-{rnd}.pprof").write_bytes(r["raw_profile"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
