"""bench.gil_hold: both joiners make the same merged segment, and the report has a line
per joiner and kind of work (no timing is asserted)."""

from __future__ import annotations

import pytest

from bench.gil_hold import _build, _segments, main, waits
from segments.format import iter_segment_batches
from segments.joins import join


def test_both_joiners_build_the_same_merged_segment() -> None:
    segs = _segments(3, 0.25)
    merged = _build(segs, join)
    assert merged == _build(segs, b"".join)
    batches = [v for _p, _h, v in iter_segment_batches(merged)]
    assert len(batches) == 3 * 2  # 128 KiB batches, two to a 0.25 MiB segment


def test_waits_are_measured_while_the_work_runs() -> None:
    ran: list[int] = []
    w = waits(lambda: ran.append(sum(range(200_000))))
    assert ran and w == sorted(w) and len(w) >= 1


def test_the_report_has_a_line_per_joiner_and_work(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--segments", "2", "--segment-mib", "0.25", "--rounds", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4
    assert [line.split(",")[1].split(":")[0].strip() for line in lines] == [
        'b"".join', 'b"".join', "segments.joins.join", "segments.joins.join"]  # fmt: skip
