"""``ingest_job.worker_setup.tune_allocator`` keeps large blocks on glibc's heap.

Checked in a fresh Python process: glibc's choices depend on the process's history (free
heap left by earlier work serves a large block without a mapping; an earlier
``mallopt`` stays for the process's life), so in the long-lived test process the
starting point "a 48 MiB block gets a mapping of its own" did not always hold."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from broker.heap_trim import HeapTrimmer
from ingest_job import worker_setup

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
SIZE = 48 * 1024 * 1024


def _probe() -> None:
    """Run in the child: glibc's figures around each 48 MiB block, before and after
    tuning, printed as JSON."""
    trimmer = HeapTrimmer.load()
    assert trimmer is not None
    out: dict[str, int | bool] = {"mapped_before": trimmer.figures().hblkhd}
    block = bytes(SIZE)
    out["mapped_default"] = trimmer.figures().hblkhd
    del block
    worker_setup.tune_allocator()
    out["mapped_tuned_before"] = trimmer.figures().hblkhd
    block = bytes(SIZE)
    out["zeroed"] = sum(block[:: 1 << 20]) == 0
    out["mapped_tuned"] = trimmer.figures().hblkhd
    out["heap_tuned"] = trimmer.figures().arena
    del block
    again = bytes(SIZE)
    out["heap_again"] = trimmer.figures().arena
    out["mapped_again"] = trimmer.figures().hblkhd
    del again
    print(json.dumps(out))


def test_tune_allocator_keeps_large_blocks_off_mmap() -> None:
    if HeapTrimmer.load() is None:
        pytest.skip("not glibc 2.33+ (no mallinfo2): nothing to check here")
    done = subprocess.run(
        [sys.executable, "-c", f"from {__name__} import _probe; _probe()"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    f = json.loads(done.stdout)
    # glibc's default: a block this large gets a mapping of its own
    assert f["mapped_default"] >= f["mapped_before"] + SIZE, f
    # tuned: from the heap, not a mapping of its own
    assert f["zeroed"], f
    assert f["mapped_tuned"] < f["mapped_tuned_before"] + SIZE, f
    assert f["heap_tuned"] >= SIZE, f
    # the freed heap is reused: the heap does not grow by a second block
    assert f["heap_again"] < f["heap_tuned"] + SIZE, f
    assert f["mapped_again"] < f["mapped_tuned_before"] + SIZE, f
