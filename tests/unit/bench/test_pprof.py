"""bench/pprof.py reads Go CPU profiles (gzip'd profile.proto): a profile encoded here
field by field, as Go's runtime/pprof writes it (packed location ids and values, inlined
frames as several lines of one location)."""

from __future__ import annotations

import gzip

from bench.pprof import parse


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(num: int, value: int | bytes) -> bytes:
    if isinstance(value, int):
        return _varint(num << 3) + _varint(value)
    return _varint(num << 3 | 2) + _varint(len(value)) + value


def _packed(values: list[int]) -> bytes:
    return b"".join(_varint(v) for v in values)


def _profile() -> bytes:
    strings = ["", "samples", "count", "cpu", "nanoseconds", "main.leaf", "main.inlined",
               "main.root"]  # fmt: skip
    out = b"".join(_field(6, s.encode()) for s in strings)
    out += _field(1, _field(1, 1) + _field(2, 2)) + _field(1, _field(1, 3) + _field(2, 4))
    for fid, name in ((1, 5), (2, 6), (3, 7)):
        out += _field(5, _field(1, fid) + _field(2, name))
    # location 1: main.leaf inlined into main.inlined (two lines); location 2: main.root
    out += _field(4, _field(1, 1) + _field(4, _field(1, 1)) + _field(4, _field(1, 2)))
    out += _field(4, _field(1, 2) + _field(4, _field(1, 3)))
    out += _field(2, _field(1, _packed([1, 2])) + _field(2, _packed([3, 30_000_000])))
    out += _field(2, _field(1, _packed([2])) + _field(2, _packed([1, 10_000_000])))
    out += _field(10, 1_000_000_000)  # duration_nanos: skipped
    return gzip.compress(out)


def test_self_and_cumulative_cpu_per_function() -> None:
    prof = parse(_profile())
    assert prof.total_ns == 40_000_000
    assert prof.self_ns == {"main.leaf": 30_000_000, "main.root": 10_000_000}
    assert prof.cum_ns == {
        "main.leaf": 30_000_000,
        "main.inlined": 30_000_000,
        "main.root": 40_000_000,
    }
    assert prof.share("main.root") == 1.0 and prof.share("main.leaf", cumulative=False) == 0.75
    assert prof.stacks[0] == (["main.leaf", "main.inlined", "main.root"], 30_000_000)
