"""A minimal reader of Go's CPU profiles (``/debug/pprof/profile``: gzip'd ``profile.proto``)
for ``bench.s3_cost``, so that no Go toolchain is needed: the CPU time per function, self
(the leaf of each sample) and cumulative (anywhere in its stack, once per sample).
"""

from __future__ import annotations

import gzip
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        out |= (b & 0x7F) << shift
        if b < 0x80:
            return out, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of a protobuf message: ints for varints, bytes for the rest."""
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        num, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield num, value
        elif wire == 2:
            n, pos = _varint(buf, pos)
            yield num, buf[pos : pos + n]
            pos += n
        elif wire == 1:
            yield num, buf[pos : pos + 8]
            pos += 8
        elif wire == 5:
            yield num, buf[pos : pos + 4]
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")


def _ints(value: int | bytes) -> list[int]:
    """A repeated integer field: packed (bytes) or one varint."""
    if isinstance(value, int):
        return [value]
    out, pos = [], 0
    while pos < len(value):
        v, pos = _varint(value, pos)
        out.append(v)
    return out


@dataclass
class Profile:
    total_ns: int = 0
    self_ns: Counter[str] = field(default_factory=Counter)
    cum_ns: Counter[str] = field(default_factory=Counter)
    stacks: list[tuple[list[str], int]] = field(default_factory=list)  # leaf first

    def share(self, name: str, cumulative: bool = True) -> float:
        ns = (self.cum_ns if cumulative else self.self_ns)[name]
        return ns / self.total_ns if self.total_ns else 0.0


def parse(raw: bytes) -> Profile:
    """The CPU nanoseconds (the last sample value) per function of a Go CPU profile."""
    data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    strings: list[bytes] = []
    functions: dict[int, int] = {}  # function id -> name string index
    locations: dict[int, list[int]] = {}  # location id -> function ids (inlined first)
    samples: list[tuple[list[int], list[int]]] = []
    for num, value in _fields(data):
        if num == 6 and isinstance(value, bytes):
            strings.append(value)
        elif num == 5 and isinstance(value, bytes):
            f = dict(_fields(value))
            functions[int(f.get(1, 0))] = int(f.get(2, 0))
        elif num == 4 and isinstance(value, bytes):
            loc_id, funcs = 0, []
            for n, v in _fields(value):
                if n == 1:
                    loc_id = int(v)
                elif n == 4 and isinstance(v, bytes):
                    funcs.append(int(dict(_fields(v)).get(1, 0)))
            locations[loc_id] = funcs
        elif num == 2 and isinstance(value, bytes):
            locs: list[int] = []
            vals: list[int] = []
            for n, v in _fields(value):
                if n == 1:
                    locs += _ints(v)
                elif n == 2:
                    vals += _ints(v)
            samples.append((locs, vals))
    prof = Profile()
    for locs, vals in samples:
        ns = vals[-1] if vals else 0
        names = [
            strings[functions.get(fid, 0)].decode(errors="replace")
            for loc in locs
            for fid in locations.get(loc, [])
        ]
        if not names:
            continue
        prof.total_ns += ns
        prof.self_ns[names[0]] += ns
        for name in set(names):
            prof.cum_ns[name] += ns
        prof.stacks.append((names, ns))
    return prof
