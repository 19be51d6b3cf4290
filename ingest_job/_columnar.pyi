"""Type stub for the native helpers built from ``_columnar.c`` (see columnar.py)."""

from typing import Any

def join_lines(validity: Any, offsets: Any, data: Any, n: int, first: int, /) -> bytes | None: ...
def avro_flat(
    validity: Any, offsets: Any, data: Any, n: int, first: int, header: bytes, codes: bytes, /
) -> list[tuple[Any, ...]] | None: ...
def json_flat(
    validity: Any, offsets: Any, data: Any, n: int, first: int, /
) -> list[tuple[Any, ...]] | None: ...
