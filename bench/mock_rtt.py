"""What the round trip costs librdkafka's producer: its mock cluster with a simulated round
trip (``test.mock.broker.rtt``, which delays every response) beside this broker, in one
run (docs/benchmarks.md, "Round 25").

``python -m bench.mock_rtt [--rtts 0,1,2,3] [--messages 300000] [--rounds 3]
[--modes idem,plain]``

Per target and mode (1 KiB values, acks=all, one partition, librdkafka's defaults but
for idempotence: the ``bench.broker`` produce worker) the median trial's MB/s, the
client's own CPU per MB (all its threads) and, for this broker (local store, embedded
metadata, the limits of ``bench.broker``), its CPU per MB and the median of its Produce
requests' duration (read -> response written, its ``/metrics``). The idempotent
producer keeps one request in flight per partition (docs/benchmarks.md, "Round 22"),
so its throughput follows the round trip; a plain producer pipelines its requests.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import uuid
from collections.abc import Iterator

from bench.broker_run import MB, MSG_SIZE, rate, target_topics
from bench.broker_targets import BrokerLimits, Target, broker_target, cpu_seconds, mock_target
from bench.broker_waits import PRODUCE, quantile, scrape_buckets
from bench.broker_workers import run_worker
from bench.fs_probe import new_workdir

MODES = {"idem": True, "plain": False}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.mock_rtt", description=__doc__.split("\n")[0])
    p.add_argument("--rtts", default="0,1,2,3", help="the mock's round trips, ms (comma list)")
    p.add_argument("--messages", type=int, default=300_000)
    p.add_argument("--rounds", type=int, default=3, help="trials per target and mode (median)")
    p.add_argument("--modes", default="idem,plain", help="idem and/or plain")
    return p


def trial(target: Target, mode: str, messages: int) -> dict[str, float]:
    """One produce run: MB/s, the client's CPU per MB, and for a broker its CPU per MB
    and its Produce requests' median duration (ms)."""
    topic = f"rtt-{mode}-{uuid.uuid4().hex[:6]}"
    spec = {"kind": "produce", "bootstrap": target.bootstrap, "topic": topic, "size": MSG_SIZE,
            "partitions": 1, "idempotence": MODES[mode]}  # fmt: skip
    target_topics(target, [topic], 1)
    run_worker({**spec, "messages": 2000})  # the topic's partition taken, the client warm
    before = scrape_buckets(target.metrics_url)
    cpu = cpu_seconds(target.pid)
    res = run_worker({**spec, "messages": messages})
    server = cpu_seconds(target.pid) - cpu
    mb = res["bytes"] / MB
    out = {"mbs": rate(res)[0], "client": res["cpu_seconds"] * 1000 / mb,
           "server": server * 1000 / mb}  # fmt: skip
    after = scrape_buckets(target.metrics_url)
    if PRODUCE in after:
        out["produce_p50"] = quantile(before.get(PRODUCE, {}), after[PRODUCE], 0.5)[0]
    return out


@contextlib.contextmanager
def _targets(rtts: list[int]) -> Iterator[list[Target]]:
    with contextlib.ExitStack() as stack:
        work = new_workdir("kafscale-mock-rtt-")
        out = [stack.enter_context(broker_target("local", work / "b", None, BrokerLimits(), []))]
        out += [stack.enter_context(mock_target(rtt)) for rtt in rtts]
        yield out


def _row(name: str, trials: list[dict[str, float]]) -> str:
    kept = sorted(trials, key=lambda t: t["mbs"])[len(trials) // 2]  # the median trial
    text = f"{name:<10} {kept['mbs']:8.1f} MB/s  client {kept['client']:5.2f} ms/MB"
    text += f"  server {kept['server']:5.2f} ms/MB"
    if "produce_p50" in kept:
        text += f"  broker Produce p50 {kept['produce_p50']:.2f} ms"
    spread = [t["mbs"] for t in trials]
    return text + f"  (MB/s of the trials: {', '.join(f'{v:.0f}' for v in spread)})"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    rtts = [int(v) for v in args.rtts.split(",") if v != ""]
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise SystemExit(f"unknown mode(s) {', '.join(unknown)}: use idem and/or plain")
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    with _targets(rtts) as targets:
        for _round in range(args.rounds):
            for mode in modes:
                for t in targets:  # in turn, so that they share the machine's noise alike
                    results.setdefault((mode, t.name), []).append(trial(t, mode, args.messages))
        names = [t.name for t in targets]
    print(f"{args.messages} x {MSG_SIZE} B, acks=all, 1 partition; median of {args.rounds}")
    for mode in modes:
        print(f"{mode}:")
        for name in names:
            print("  " + _row(name, results[(mode, name)]))
        zero = "mock" if "mock" in names else None
        if zero is not None:
            base = statistics.median(t["mbs"] for t in results[(mode, zero)])
            ratios = ", ".join(
                f"{n} {statistics.median(t['mbs'] for t in results[(mode, n)]) / base:.2f}"
                for n in names
                if n != zero
            )
            print(f"  MB/s against the mock without a round trip: {ratios}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
