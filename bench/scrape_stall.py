"""How long a ``/metrics`` scrape holds the broker's event loop (docs/benchmarks.md,
"Round 21").

    python -m bench.scrape_stall [--lag-partitions 1000] [--scrapes 10] [--rounds 3]
                                 [--base-tree DIR]

Per trial a fresh broker (local store, embedded metadata; from ``--base-tree`` too, the
two alternating) gets a topic of ``--lag-partitions`` partitions with a consumer group's
offsets committed on each (``bench.paced_tail.lagged_group``: a lag and a committed-offset
series per partition, as a broker coordinating groups over many partitions exports).
Then a probe connection sends ApiVersions requests back to back (0.5 ms apart) for two
windows of ``--scrapes`` x 0.3 s: in the first nothing else happens, in the second
``/metrics`` is scraped once per 0.3 s. A request the event loop cannot answer waits for
whatever holds it, so the probe's slowest round trips are the loop's longest stalls. It
prints per window the probe's p50 / p99 / max, and the scrape's duration and the broker's
CPU per scrape (the scraped window's CPU less the idle one's); the medians and their
ratios close the report. Processes are stopped by PID.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import struct
import threading
import time
import urllib.request
from pathlib import Path

from bench.alternating import alternate
from bench.broker_targets import BrokerLimits, base_target, broker_target, cpu_seconds
from bench.paced_tail import lagged_group
from bench.stats import percentile

PROBE_GAP_S = 0.0005
WINDOW_STEP_S = 0.3
API_VERSIONS = 18


def probe(bootstrap: str, stop: threading.Event, rtts: list[float]) -> None:
    """ApiVersions v0 round trips on one connection until ``stop`` is set."""
    host, _, port = bootstrap.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client = b"stall-probe"
        corr = 0
        while not stop.is_set():
            corr += 1
            body = struct.pack(">hhih", API_VERSIONS, 0, corr, len(client)) + client
            start = time.perf_counter()
            s.sendall(struct.pack(">i", len(body)) + body)
            size = struct.unpack(">i", _read(s, 4))[0]
            if struct.unpack(">i", _read(s, size)[:4])[0] != corr:
                raise RuntimeError("ApiVersions answered out of order")
            rtts.append(time.perf_counter() - start)
            time.sleep(PROBE_GAP_S)


def _read(s: socket.socket, n: int) -> bytes:
    data = s.recv(n, socket.MSG_WAITALL)
    if len(data) != n:
        raise RuntimeError("the broker closed the probe connection")
    return data


def window(bootstrap: str, url: str | None, pid: int | None, scrapes: int) -> dict[str, float]:
    """One probe window of ``scrapes`` steps, scraping ``url`` once a step (None: idle)."""
    stop = threading.Event()
    rtts: list[float] = []
    took: list[float] = []
    thread = threading.Thread(target=probe, args=(bootstrap, stop, rtts), daemon=True)
    cpu = cpu_seconds(pid)
    thread.start()
    try:
        for _ in range(scrapes):
            time.sleep(WINDOW_STEP_S)
            if url is not None:
                start = time.perf_counter()
                with urllib.request.urlopen(url, timeout=30) as resp:
                    resp.read()
                took.append(time.perf_counter() - start)
    finally:
        stop.set()
        thread.join(30)
    cpu = cpu_seconds(pid) - cpu
    rtts.sort()
    return {
        "probes": float(len(rtts)),
        "p50_ms": 1000 * percentile(rtts, 0.5),
        "p99_ms": 1000 * percentile(rtts, 0.99),
        "max_ms": 1000 * rtts[-1],
        "scrape_ms": 1000 * statistics.median(took) if took else 0.0,
        "cpu_s": cpu,
    }


def trial(tree: Path | None, args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    limits = BrokerLimits()
    target = (base_target(workdir, tree, limits, []) if tree is not None
              else broker_target("local", workdir, None, limits, []))  # fmt: skip
    with target as t:
        if t.metrics_url is None:
            raise RuntimeError("the broker serves no /metrics")
        if args.lag_partitions:
            lagged_group(t.bootstrap, args.lag_partitions)
        with urllib.request.urlopen(t.metrics_url, timeout=30) as resp:
            lines = resp.read().count(b"\n")
        idle = window(t.bootstrap, None, t.pid, args.scrapes)
        busy = window(t.bootstrap, t.metrics_url, t.pid, args.scrapes)
    out = {f"idle_{k}": v for k, v in idle.items() if k not in ("scrape_ms", "cpu_s")}
    out.update({f"scraped_{k}": v for k, v in busy.items() if k != "cpu_s"})
    # the scrapes' own CPU: the window's less the idle window's (the probe's, the passes')
    out["scraped_cpu_ms"] = 1000 * max(0.0, busy["cpu_s"] - idle["cpu_s"]) / args.scrapes
    out["lines"] = float(lines)
    return out


def _fmt(r: dict[str, float]) -> str:
    return (f"idle p99 {r['idle_p99_ms']:.2f} / max {r['idle_max_ms']:.1f} ms; scraped "
            f"p50 {r['scraped_p50_ms']:.2f} / p99 {r['scraped_p99_ms']:.2f} / max "
            f"{r['scraped_max_ms']:.1f} ms; a scrape of {r['lines']:.0f} lines "
            f"{r['scraped_scrape_ms']:.1f} ms, CPU {r['scraped_cpu_ms']:.1f} ms")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scrape_stall", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--lag-partitions", type=int, default=1000)
    ap.add_argument("--scrapes", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--base-tree", type=Path, help="another source tree, run alongside")
    args = ap.parse_args(argv)
    keys = ("scraped_p99_ms", "scraped_max_ms", "scraped_cpu_ms")
    alternate(lambda tree, wd: trial(tree, args, wd), args.base_tree, args.rounds, _fmt,
              keys, "kafscale-stall-")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
