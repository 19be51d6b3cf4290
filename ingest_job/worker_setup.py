"""Once-per-process settings of the Spark Python workers that run ingest tasks.

Both cut CPU that is not the task's work (docs/benchmarks.md, "Ingest", round 3); they
are applied by the Spark task (``ingest_job.job``), never in the driver.
"""

from __future__ import annotations

import gc

M_TRIM_THRESHOLD = -1  # glibc mallopt parameters
M_MMAP_MAX = -4
#: free heap kept for the worker's next task before glibc returns it to the OS
TRIM_THRESHOLD_BYTES = 1 << 30

_state = {"allocator": False, "frozen": False}


def tune_allocator() -> None:
    """Keep the decoded columns' large blocks on the heap (glibc only; else nothing).

    A unit's record buffers (``protocol/_fastrecords.c``: tens of MB of values, keys,
    offsets) are Python bytes, so glibc's malloc gave each its own ``mmap``: every task
    page-faulted ~200 MB of fresh zeroed memory per 1M records and unmapped it again,
    ~70% of the decoder's time (0.18 -> 0.06 s per 1M records, one process). With no
    mmap for large blocks and free heap trimmed only beyond 1 GiB, a worker reuses its
    previous task's memory: it keeps its peak heap (about two units' columns) between
    tasks. pyarrow's own buffers (mimalloc) are not affected.
    """
    if _state["allocator"]:
        return
    _state["allocator"] = True
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_MMAP_MAX, 0)
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    except (OSError, AttributeError):  # not glibc: nothing to tune
        pass


def freeze_heap() -> None:
    """Once per Python worker, after its first task: move every object alive now (nearly
    all of them the modules and classes that pyarrow, pyiceberg and pyspark imported) to
    the garbage collector's permanent generation.

    PySpark's daemon runs ``gc.collect()`` after every task of a reused worker, and each
    one walked those ~100k objects: ~50 ms of CPU per task, a fifth of the Parquet
    limit's time for 1M records. Later garbage is collected as before; what is frozen
    is what the worker keeps anyway (after one last collection).
    """
    if _state["frozen"]:
        return
    _state["frozen"] = True
    gc.collect()  # garbage of the imports is not kept
    gc.freeze()
