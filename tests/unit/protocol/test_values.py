"""``protocol.values.value``: frozen to the type checker, plain and hashable at run time."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest
from mypy import api as mypy_api

from protocol.batch import BatchHeader
from protocol.values import value

REPO = Path(__file__).resolve().parents[3]


@value
class Pair:
    a: int
    b: int = 0


def test_values_compare_and_hash_by_value() -> None:
    assert Pair(1, 2) == Pair(1, 2) and Pair(1, 2) != Pair(1, 3)
    assert len({Pair(1, 2), Pair(1, 2), Pair(2, 2)}) == 2
    assert dataclasses.replace(Pair(1, 2), b=5) == Pair(1, 5)
    assert not hasattr(Pair(1), "__dict__")  # slotted


def test_a_batch_header_is_a_value() -> None:
    h = BatchHeader(0, 49, -1, 2, 7, 0, 0, 1, 1, -1, -1, -1, 1)
    assert h.size == 61 and h.last_offset == 0
    assert hash(h) == hash(BatchHeader(0, 49, -1, 2, 7, 0, 0, 1, 1, -1, -1, -1, 1))


def test_mypy_rejects_an_assignment_to_a_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)  # where mypy finds the package
    src = tmp_path / "assigns.py"
    src.write_text(
        textwrap.dedent(
            """
            from protocol.values import value

            @value
            class Pair:
                a: int

            p = Pair(1)
            p.a = 2
            """
        )
    )
    out, _err, status = mypy_api.run(
        [str(src), "--no-incremental", "--cache-dir", str(tmp_path / "cache")]
    )
    assert status == 1 and 'Property "a" defined in "Pair" is read-only' in out
