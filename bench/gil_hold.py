"""How long the event loop's thread can wait for the GIL while a worker thread joins a
segment's buffers (docs/benchmarks.md, "Round 20").

    python -m bench.gil_hold [--segments 16] [--segment-mib 1] [--rounds 10]

A worker thread builds a merged segment of ``--segments`` segments of ``--segment-mib``
MiB (1 KiB records, 128 to a batch; ``broker.merging._build_merged``'s walk and build)
and joins its buffers, ``--rounds`` times, once with ``b"".join`` and once with
``segments.joins.join``. Meanwhile the main thread sleeps 0.2 ms at a time and records
how long each sleep really took: a sleep that ends late waited for the GIL. Printed per
join: the longest wait, the 99th percentile and the waits over 2 ms.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable, Sequence

from bench.stats import percentile
from segments.format import iter_batch_frames
from segments.joins import join
from segments.store import Buffer
from segments.writer import build_segment


def _segments(count: int, mib: float) -> list[bytes]:
    from protocol.records import build_batch

    out: list[bytes] = []
    offset = 0
    batches = max(1, round(mib * 1024 / 128))  # 128 KiB batches
    records = [(None, bytes(1024), None)] * 128
    for _ in range(count):
        views = []
        for _b in range(batches):
            views.append(memoryview(build_batch(records, base_offset=offset)))
            offset += 128
        seg = build_segment(offset - 128 * batches, views, 1)
        out.append(b"".join(seg.buffers))
    return out


def _build(segs: list[bytes], joiner: Callable[[Sequence[Buffer]], bytes]) -> bytes:
    views = [view for data in segs for _p, _f, view in iter_batch_frames(data)]
    return joiner(build_segment(0, views, 1).buffers)


def waits(work: Callable[[], object]) -> list[float]:
    """The main thread's 0.2 ms sleeps, each as long as it really took, while ``work``
    runs in a thread."""
    out: list[float] = []
    t = threading.Thread(target=work)
    t.start()
    while True:  # one sleep at least, however short the work
        a = time.perf_counter()
        time.sleep(0.0002)
        out.append(time.perf_counter() - a)
        if not t.is_alive():
            break
    t.join()
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gil_hold", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--segments", type=int, default=16)
    ap.add_argument("--segment-mib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args(argv)
    segs = _segments(args.segments, args.segment_mib)
    mb = sum(len(s) for s in segs) / 1e6
    joiners: list[tuple[str, Callable[[Sequence[Buffer]], bytes]]] = [
        ('b"".join', b"".join), ("segments.joins.join", join)]  # fmt: skip
    views = [memoryview(s) for s in segs]
    for name, joiner in joiners:
        for what, work in (
            ("join", lambda j=joiner: [j(views) for _ in range(args.rounds)]),
            ("build + join", lambda j=joiner: [_build(segs, j) for _ in range(args.rounds)]),
        ):  # fmt: skip
            w = waits(work)
            print(f"{what} of {mb:.1f} MB x {args.rounds}, {name}: main thread's longest wait "
                  f"{1000 * w[-1]:.2f} ms, p99 {1000 * percentile(w, 0.99):.2f} ms, "
                  f"{sum(x > 0.002 for x in w)} waits over 2 ms of {len(w)}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
