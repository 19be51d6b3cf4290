"""``protocol.crc32c_combine``: the CRC-32C of a concatenation from its pieces' CRCs, in C
(``protocol/_fastrecords.c``) and in pure Python, against the ``crc32c`` package hashing
the concatenation itself."""

from __future__ import annotations

import os
from collections.abc import Callable

import crc32c as crc_pkg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import crc32c_combine as mod
from protocol.native import load_native

Combine = Callable[[int, int, int], int]

_native = load_native("protocol._fastrecords")
IMPLS: list[tuple[str, Combine]] = [("python", mod.combine_python)]
if _native is not None and hasattr(_native, "crc32c_combine"):
    IMPLS.append(("c", _native.crc32c_combine))

PROPS = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
CRC = st.integers(0, 0xFFFFFFFF)
LENGTH = st.integers(0, (1 << 63) - 1)


def crc(data: bytes) -> int:
    return int(crc_pkg.crc32c(data))


def chain(combine: Combine, pieces: list[bytes]) -> int:
    value = 0
    for piece in pieces:
        value = combine(value, crc(piece), len(piece))
    return value


def test_the_c_implementation_is_built() -> None:
    """The C one is what the broker uses when the extension is built (CI builds it)."""
    if _native is None:
        pytest.skip("protocol._fastrecords is not built (or KAFSCALE_PURE_PYTHON is set)")
    assert mod.IMPLEMENTATION == "c" and mod.crc32c_combine is _native.crc32c_combine


@pytest.mark.parametrize(("name", "combine"), IMPLS, ids=[n for n, _ in IMPLS])
@PROPS
@given(data=st.binary(max_size=4096), cuts=st.lists(st.integers(0, 4096), max_size=8))
def test_random_splits_match_the_direct_crc(
    name: str, combine: Combine, data: bytes, cuts: list[int]
) -> None:
    """Any split into pieces (empty ones included) chains to the CRC of the whole."""
    bounds = sorted({0, len(data), *(min(c, len(data)) for c in cuts)})
    pieces = [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    pieces.insert(len(pieces) // 2, b"")
    assert chain(combine, pieces) == crc(data)


@pytest.mark.parametrize(("name", "combine"), IMPLS, ids=[n for n, _ in IMPLS])
@PROPS
@given(a=st.binary(max_size=300), b=st.binary(max_size=300))
def test_two_pieces(name: str, combine: Combine, a: bytes, b: bytes) -> None:
    assert combine(crc(a), crc(b), len(b)) == crc(a + b)
    assert combine(crc(a), crc(b""), 0) == crc(a)  # an empty second piece: unchanged
    assert combine(crc(b""), crc(b), len(b)) == crc(b)  # an empty first piece


@pytest.mark.parametrize(("name", "combine"), IMPLS, ids=[n for n, _ in IMPLS])
def test_megabyte_pieces(name: str, combine: Combine) -> None:
    """Lengths of real batches and segments, with every byte-length bit up to 2^24."""
    a, b = os.urandom(3_000_017), os.urandom((1 << 24) - 1)
    assert combine(crc(a), crc(b), len(b)) == crc(a + b)
    zeros = bytes(1 << 24)
    half = crc(zeros[: 1 << 23])
    assert combine(half, half, 1 << 23) == crc(zeros)


@pytest.mark.parametrize(("name", "combine"), IMPLS, ids=[n for n, _ in IMPLS])
@PROPS
@given(c1=CRC, c2=CRC, c3=CRC, n=LENGTH, m=LENGTH)
def test_large_lengths_are_associative(
    name: str, combine: Combine, c1: int, c2: int, c3: int, n: int, m: int
) -> None:
    """Lengths far past what can be hashed here: ``(A + B) + C == A + (B + C)``."""
    if n + m >= 1 << 63:
        m = (1 << 63) - 1 - n
    assert combine(combine(c1, c2, n), c3, m) == combine(c1, combine(c2, c3, m), n + m)


@PROPS
@given(c1=CRC, c2=CRC, n=LENGTH)
def test_c_and_python_agree(c1: int, c2: int, n: int) -> None:
    if len(IMPLS) < 2:
        pytest.skip("protocol._fastrecords is not built: only the Python one to test")
    assert IMPLS[1][1](c1, c2, n) == mod.combine_python(c1, c2, n)


@pytest.mark.parametrize(("name", "combine"), IMPLS, ids=[n for n, _ in IMPLS])
def test_a_negative_length_is_refused(name: str, combine: Combine) -> None:
    with pytest.raises(ValueError):
        combine(1, 2, -1)
