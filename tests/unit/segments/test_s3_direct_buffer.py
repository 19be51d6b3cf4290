"""segments/s3_direct.py: the buffers direct GETs read bodies into (docs/benchmarks.md,
Round 4: cold reads): the right size, writable while read into, and a large one backed
by transparent huge pages where the kernel offers them."""

from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path

import pytest

from segments.s3_direct import HUGE_PAGE, MAP_MIN, _buffer

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _thp_mode() -> str | None:
    try:
        m = re.search(r"\[(\w+)\]", THP.read_text())
    except OSError:
        return None
    return m.group(1) if m else None


def _vma_of(addr: int) -> dict[str, str]:
    """The fields of this process's mapping holding ``addr`` (/proc/self/smaps)."""
    fields: dict[str, str] = {}
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if head:
            if inside:
                break
            inside = int(head.group(1), 16) <= addr < int(head.group(2), 16)
            continue
        if inside and ":" in line:
            k, v = line.split(":", 1)
            fields[k.strip()] = v.strip()
    return fields


def _address(view: memoryview) -> int:
    ref = ctypes.c_char.from_buffer(view)
    try:
        return ctypes.addressof(ref)
    finally:
        del ref


@pytest.mark.parametrize(
    "n", [1, MAP_MIN - 1, MAP_MIN, HUGE_PAGE - 1, HUGE_PAGE, 3 * HUGE_PAGE + 17, 8 << 20]
)
def test_a_buffer_holds_a_body_of_its_length(n: int) -> None:
    view = _buffer(n)
    assert len(view) == n and not view.readonly
    data = os.urandom(n)
    view[:] = data
    assert view.toreadonly() == data


def test_a_large_body_lands_in_huge_pages() -> None:
    mode = _thp_mode()
    if mode not in ("always", "madvise"):
        pytest.skip(f"transparent huge pages are {mode or 'not available'} on this kernel")
    fallbacks = _vmstat("thp_fault_fallback")
    view = _buffer(8 << 20)
    addr = _address(view)
    assert addr % HUGE_PAGE == 0  # the body starts at a huge page boundary
    vma = _vma_of(addr)
    assert vma.get("THPeligible") == "1"  # advised (under "madvise": only if asked)
    # the kernel may merge the mapping with an advised neighbour: count what the body adds
    before = int(vma["AnonHugePages"].split()[0])
    view[:] = os.urandom(len(view))  # the body read in: the pages fault in, 2 MiB each
    if _vmstat("thp_fault_fallback") != fallbacks:
        pytest.skip("the kernel had no free huge page at hand (a fallback, not an error)")
    vma = _vma_of(addr)
    assert int(vma["AnonHugePages"].split()[0]) - before == 8 << 10, vma


def _vmstat(name: str) -> int:
    for line in Path("/proc/vmstat").read_text().splitlines():
        k, _, v = line.partition(" ")
        if k == name:
            return int(v)
    return 0
