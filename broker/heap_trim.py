"""Giving the heap's free pages back to the OS (glibc; docs/operations.md, "Memory").

The broker fixes glibc's allocator thresholds at start-up (``broker/cli_broker.py``,
``_fixed_mmap_threshold``): blocks up to 32 MiB (request frames, the segments of flush
cycles and merges) come from the heap and are reused there instead of being page-faulted
fresh every time, and only free space at the *top* of the heap past 32 MiB is trimmed. A
block freed in the middle keeps its pages. So the RSS stays at the heap's high-water
mark: after a consume from offset 0 on S3 the broker's RSS was 234 MiB, and 151 MiB after
one ``malloc_trim(0)`` (docs/benchmarks.md, "Round 26").

:class:`HeapTrimmer` asks glibc every ``--heap-trim-interval-ms`` how many bytes of the
heap are free (``mallinfo2``) and, from ``min_free_bytes`` on, releases their pages
(``malloc_trim``: ``madvise(MADV_DONTNEED)`` on every whole free page, the top trimmed).
The call runs in a worker thread: it releases the GIL, but holds glibc's arena lock
meanwhile (7-11 ms for ~80 MiB released on the project's VM), so a ``malloc`` of another
thread waits that long. A page it released is faulted in again (zeroed) when the heap
grows back into it. Not glibc (or older than 2.33, without ``mallinfo2``): nothing is
trimmed.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging

log = logging.getLogger(__name__)

#: trim only from this much free heap on: the top-of-heap trim threshold the broker sets
MIN_FREE_BYTES = 32 * 1024 * 1024


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


class HeapTrimmer:
    """Releases the heap's free pages when at least ``min_free_bytes`` of it are free.
    :meth:`load` gives one where the C library is glibc with ``mallinfo2``, else None."""

    def __init__(self, libc: ctypes.CDLL, min_free_bytes: int = MIN_FREE_BYTES) -> None:
        self._mallinfo2 = libc.mallinfo2
        self._mallinfo2.restype = _MallInfo2
        self._mallinfo2.argtypes = []
        self._malloc_trim = libc.malloc_trim
        self._malloc_trim.restype = ctypes.c_int
        self._malloc_trim.argtypes = [ctypes.c_size_t]
        self.min_free_bytes = min_free_bytes
        self.trims = 0  # trims made
        self.checks = 0  # times the free heap was looked at

    @classmethod
    def load(cls, min_free_bytes: int = MIN_FREE_BYTES) -> HeapTrimmer | None:
        try:
            return cls(ctypes.CDLL("libc.so.6"), min_free_bytes)
        except (OSError, AttributeError):  # not glibc, or glibc before 2.33
            return None

    def figures(self) -> _MallInfo2:
        """glibc's allocator figures now (``mallinfo2``): ``fordblks`` the heap's free
        bytes, ``arena`` the heap's, ``hblkhd`` those in blocks with a mapping of their own."""
        info: _MallInfo2 = self._mallinfo2()
        return info

    def free_bytes(self) -> int:
        """Bytes in the heap's free chunks (``mallinfo2().fordblks``)."""
        return int(self.figures().fordblks)

    def trim(self) -> bool:
        """Release the free heap's pages if ``min_free_bytes`` or more are free (blocking:
        call it in a worker thread); whether it trimmed."""
        self.checks += 1
        free = self.free_bytes()
        if free < self.min_free_bytes:
            return False
        self._malloc_trim(0)
        self.trims += 1
        log.debug("heap trimmed: %d MiB were free", free >> 20)
        return True

    async def run(self, interval_s: float) -> None:
        """Trim every ``interval_s`` until cancelled."""
        while True:
            await asyncio.sleep(interval_s)  # a schedule, not a wait for state
            await asyncio.to_thread(self.trim)
