"""CRC-32C combination: the CRC of ``A + B`` from ``crc(A)``, ``crc(B)`` and ``len(B)``
(zlib's ``crc32_combine``, for the Castagnoli polynomial), without reading A or B.

The broker verifies every produced batch's CRC-32C (``protocol/validate.py``); that CRC
covers the batch from ``attributes`` (byte 21) to its end. The segment footer's body CRC
and the object's CRC (the local store's ETag, S3's ``x-amz-checksum-crc32c``) are then
derived from it instead of hashing the same bytes twice more (docs/format.md, "Segment
file"; docs/benchmarks.md, "Round 4: CRC passes").

The math: appending ``n`` bytes to a message multiplies its (raw) CRC register by
``x^(8n)`` modulo the polynomial and adds the CRC of the appended bytes, so
``crc(A + B) = crc(A) * x^(8 len(B)) mod P  xor  crc(B)`` (the pre- and post-inversion
of the standard CRC cancel out). The power is a product of the precomputed powers
``x^(2^k)`` for the bits set in ``8 len(B)``: O(log n) per combine.

:func:`crc32c_combine` is the native one (``protocol/_fastrecords.c``) when the C
extension is built (and ``KAFSCALE_PURE_PYTHON`` is unset), else :func:`combine_python`:
per power, four 256-entry tables (one per byte of the register) make a multiplication
four lookups. Both give identical results (tests/unit/protocol/test_crc32c_combine.py).
"""

from __future__ import annotations

from collections.abc import Callable

from protocol.native import load_native

POLY = 0x82F63B78  # CRC-32C (Castagnoli), reflected
_X0 = 1 << 31  # x^0 in the reflected representation
_MASK = 0xFFFFFFFF


def multmodp(a: int, b: int) -> int:
    """``a * b mod P`` for reflected polynomials (zlib's ``multmodp``)."""
    m = _X0
    p = 0
    while True:
        if a & m:
            p ^= b
            if not a & (m - 1):
                return p
        m >>= 1
        b = (b >> 1) ^ POLY if b & 1 else b >> 1


def _powers() -> list[int]:
    """``x^(2^k) mod P`` for k = 0..66 (byte lengths below 2^63)."""
    out = [1 << 30]  # x^1
    for _ in range(66):
        out.append(multmodp(out[-1], out[-1]))
    return out


_POW2 = _powers()
# per byte-length bit k: four tables of (x^(8 * 2^k) * v) for v = b << 8j, b in 0..255
_TABLES: dict[int, tuple[list[int], list[int], list[int], list[int]]] = {}


def _tables(k: int) -> tuple[list[int], list[int], list[int], list[int]]:
    got = _TABLES.get(k)
    if got is not None:
        return got
    power = _POW2[k + 3]  # x^(8 * 2^k) = x^(2^(k + 3))
    out: list[list[int]] = []
    for j in range(4):
        basis = [multmodp(power, 1 << (8 * j + i)) for i in range(8)]
        table = [0] * 256
        for v in range(1, 256):
            low = v & -v
            table[v] = table[v ^ low] ^ basis[low.bit_length() - 1]
        out.append(table)
    got = (out[0], out[1], out[2], out[3])
    _TABLES[k] = got
    return got


def combine_python(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32C of ``A + B`` given ``crc1 = crc32c(A)``, ``crc2 = crc32c(B)`` and
    ``len2 = len(B)`` (pure Python)."""
    if len2 < 0:
        raise ValueError("negative length")
    if len2 >= 1 << 63:
        raise OverflowError("length past 2^63 - 1")
    s = crc1 & _MASK
    k = 0
    n = len2
    while n:
        if n & 1:
            t0, t1, t2, t3 = _tables(k)
            s = t0[s & 0xFF] ^ t1[(s >> 8) & 0xFF] ^ t2[(s >> 16) & 0xFF] ^ t3[s >> 24]
        n >>= 1
        k += 1
    return s ^ (crc2 & _MASK)


_native_combine: Callable[[int, int, int], int] | None = getattr(
    load_native("protocol._fastrecords"), "crc32c_combine", None
)

#: ``crc32c_combine(crc1, crc2, len2)``: native when built, else :func:`combine_python`
crc32c_combine: Callable[[int, int, int], int] = _native_combine or combine_python
#: "c" or "python": which :func:`crc32c_combine` is in use
IMPLEMENTATION = "c" if _native_combine is not None else "python"
