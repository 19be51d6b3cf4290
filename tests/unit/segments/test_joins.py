"""segments.joins.join: the same bytes as ``b"".join`` for every kind of buffer a segment
is made of, natively (segments/_localio.c) and through the fallback."""

from __future__ import annotations

import random

import pytest

from segments import joins
from segments.store import Buffer


def _pieces(rng: random.Random) -> list[Buffer]:
    out: list[Buffer] = []
    for _ in range(rng.randrange(0, 12)):
        data = rng.randbytes(rng.choice((0, 1, 7, 100, 4096, 70_000)))
        kind = rng.randrange(4)
        if kind == 0:
            out.append(data)
        elif kind == 1:
            out.append(bytearray(data))
        elif kind == 2:
            out.append(memoryview(data))
        else:  # a slice of a larger buffer, as a batch is of its request frame
            frame = rng.randbytes(5) + data + rng.randbytes(3)
            out.append(memoryview(frame)[5 : 5 + len(data)])
    return out


@pytest.mark.parametrize("native", [True, False], ids=["native", "fallback"])
def test_join_is_b_join_on_random_buffers(native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if native and joins._native is None:
        pytest.skip("segments._localio is not built (pip install -e . builds it)")
    if not native:
        monkeypatch.setattr(joins, "_native", None)
    rng = random.Random(20)
    for _ in range(300):
        pieces = _pieces(rng)
        got = joins.join(pieces)
        assert type(got) is bytes
        assert got == b"".join(pieces)
    assert joins.join(()) == b""  # any sequence, empty too


def test_the_native_join_refuses_what_is_not_one_contiguous_buffer() -> None:
    if joins._native is None:
        pytest.skip("segments._localio is not built (pip install -e . builds it)")
    with pytest.raises(TypeError):
        joins.join([b"a", "text"])  # type: ignore[list-item]
    with pytest.raises(BufferError):
        joins.join([memoryview(bytes(10))[::2]])  # strided: not one block of memory
    with pytest.raises(TypeError):
        joins.join(5)  # type: ignore[arg-type]
