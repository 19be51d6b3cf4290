"""What a new file costs in a bench's work directory (docs/benchmarks.md, "Round 22").

A flush cycle on the local store makes one new file per object. On ext4 without a
journal (this project's VMs; docs/benchmarks.md, "Round 6") the kernel will not hand out
an inode freed in the last 60 s (300 s while its inode-table block is still dirty):
``find_inode_bit`` walks past every such inode of the block group, reading each one's
deletion time (``recently_deleted``), so a file made where many files were just deleted
costs 0.2-1.1 ms of system CPU instead of 0.01-0.04 ms. A bench's own clean-up (the previous
run's work directory, gigabytes of segment files) is such a deletion: the CPU per MB of a
run right after another one rises with it. ``creation_ms`` measures it in the directory
the run will use, so that every report says which kind of run it was.

``bench_dir`` is where the benches make their work directories: a directory under the
system's temp directory marked as a top of a directory hierarchy (ext4's ``T`` attribute,
``chattr +T``), so that ext4 spreads its subdirectories over the block groups as it does
for directories at the root of a file system. A run's files then land in a group of their
own, most likely not the one a previous run just freed: with the mark a new directory
after 100,000 files were deleted beside it made files at 0.02-0.16 ms each, without it at
0.97 ms (docs/benchmarks.md, "Round 22"). Elsewhere (another file system) the mark is
not set and nothing else changes.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

PROBE_FILES = 200
BENCH_DIR = "kafscale-bench"
FS_IOC_GETFLAGS = 0x80086601
FS_IOC_SETFLAGS = 0x40086602
FS_TOPDIR_FL = 0x00020000


def bench_dir() -> Path:
    """The parent of the benches' work directories (made, and marked a top directory
    where the file system supports it)."""
    path = Path(tempfile.gettempdir()) / BENCH_DIR
    path.mkdir(exist_ok=True)
    with contextlib.suppress(OSError):
        mark_topdir(path)
    return path


def mark_topdir(path: Path) -> bool:
    """Set the top-directory attribute on ``path``; False when it was set already.
    Raises OSError where the file system has no such attribute."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        flags = _flags(fd)
        if flags & FS_TOPDIR_FL:
            return False
        new = (flags | FS_TOPDIR_FL).to_bytes(4, sys.byteorder) + bytes(4)
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, bytearray(new), True)
        return True
    finally:
        os.close(fd)


def topdir_marked(path: Path) -> bool:
    """Whether ``path`` carries the top-directory attribute (OSError: no attributes)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return bool(_flags(fd) & FS_TOPDIR_FL)
    finally:
        os.close(fd)


def _flags(fd: int) -> int:
    """The inode's attribute flags (``FS_IOC_GETFLAGS``: the kernel writes an int; the
    buffer has room for the long its definition names)."""
    buf = bytearray(8)
    fcntl.ioctl(fd, FS_IOC_GETFLAGS, buf, True)
    return int.from_bytes(buf[:4], sys.byteorder)


def new_workdir(prefix: str) -> Path:
    """A fresh work directory in ``bench_dir()``, removed when the process exits (a caller
    done with it sooner removes it itself). Several harnesses left theirs behind, GBs of
    segments each (round 24)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=bench_dir()))
    atexit.register(shutil.rmtree, path, True)
    return path


def creation_ms(directory: Path, files: int = PROBE_FILES) -> float:
    """Wall milliseconds per empty file created in a new directory inside ``directory``
    (removed again: ``files`` deletions, a fraction of what a bench run makes)."""
    probe = Path(tempfile.mkdtemp(prefix="fs-probe-", dir=directory))
    try:
        start = time.perf_counter()
        for i in range(files):
            os.close(os.open(probe / f"f{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        return (time.perf_counter() - start) * 1000 / files
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def describe(ms: float) -> str:
    """The report's line for a probe's result."""
    return (
        f"file creation in the work directory: {ms:.3f} ms per file (ext4 without a"
        " journal: 0.2-1.1 ms where many files were deleted in the last minutes, such as"
        " a previous run's; docs/benchmarks.md, Round 22)"
    )
