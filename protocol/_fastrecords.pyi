"""Type stub for the native decoder built from ``_fastrecords.c`` (see fastrecords.py)."""

from collections.abc import Sequence

from protocol.records import Buf

class CorruptRecords(ValueError): ...

def decode(
    batches: Sequence[tuple[Buf, int, int, int, int, int]],
    start: int,
    end: int,
    strict_utf8: bool,
    /,
) -> tuple[
    int,
    bytes,
    bytes,
    bytes,
    bytes,
    bytes,
    bytes,
    int,
    bytes,
    bytes,
    bytes,
    int,
    bytes,
    bytes,
    bytes,
    bytes,
    bytes,
    bytes,
    int,
    int,
]: ...
def scan(records: Buf, count: int, /) -> tuple[int, int]: ...
def crc32c_combine(crc1: int, crc2: int, len2: int, /) -> int: ...
