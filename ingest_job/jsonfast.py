"""A vectorized fast path for JSON values: pyarrow's JSON reader over all of a unit's
values at once (C++, no per-record Python), giving the same columns as
:func:`ingest_job.jsonvals.parse_json_values` would.

It is only taken when it cannot differ from the exact path: one JSON object per value on
one line, top-level fields that are all long / double / boolean / string (no nested
objects or arrays, which the exact path stores as JSON text), no type conflicts, known
columns holding values of their type, no two fields naming one column. Anything else
(including every record the exact path would send to the dead-letter table) returns None
and the caller runs the exact path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa
import pyarrow.json as pj

_KINDS = {pa.int64(): "long", pa.float64(): "double", pa.bool_(): "boolean", pa.string(): "string"}
_TYPES = {k: t for t, k in _KINDS.items()}
_BLOCK = 1 << 24


def parse_fast(
    values: Sequence[bytes | None], known: Mapping[str, str], column_name: object
) -> tuple[dict[str, str], dict[str, pa.Array]] | None:
    """(column kinds, column arrays) for every value, or None: use the exact path."""
    if not values:
        return None
    buf = b"\n".join(b"{}" if v is None else v for v in values)
    if buf.count(b"\n") != len(values) - 1 or b"\r" in buf:
        return None  # a value spanning lines
    return parse_lines(buf, len(values), known, column_name)


def parse_lines(
    buf: bytes, count: int, known: Mapping[str, str], column_name: object
) -> tuple[dict[str, str], dict[str, pa.Array]] | None:
    """:func:`parse_fast` over ``count`` values already joined one per line (nulls as
    ``{}``; ``ingest_job.columnar.json_lines``)."""
    if not count:
        return None
    table = _read(buf, {})
    if table is None:
        return None
    strings = {
        n: pa.string()
        for n in table.column_names
        if pa.types.is_timestamp(table.schema.field(n).type)
    }
    if strings:  # ISO-looking strings: read them as the strings they are
        table = _read(buf, strings)
        if table is None:
            return None
    if table.num_rows != count:
        return None
    kinds: dict[str, str] = {}
    arrays: dict[str, pa.Array] = {}
    for raw_name in table.column_names:
        col = table.column(raw_name)
        name = column_name(raw_name)  # type: ignore[operator]
        if name in arrays:
            return None  # two fields, one column
        if pa.types.is_null(col.type):
            continue  # only ever null: not a column (as the exact path)
        kind = _KINDS.get(col.type)
        if kind is None:
            return None
        want = known.get(name)
        if want is not None and want != kind:
            if not (want == "double" and kind == "long"):
                return None  # the exact path decides (conflicts, dead letters)
            # past 2**53: rounded to the nearest double, as the exact path's float()
            col = col.cast(pa.float64(), safe=False)
            kind = "double"
        if kind == "string" and not _utf8(col):
            return None  # the reader passes invalid UTF-8 through: the exact path rejects it
        kinds[name] = kind
        arrays[name] = col.combine_chunks()
    return kinds, arrays


def _utf8(col: pa.ChunkedArray) -> bool:
    try:
        col.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def _read(buf: bytes, explicit: dict[str, pa.DataType]) -> pa.Table | None:
    parse = pj.ParseOptions(
        explicit_schema=pa.schema(list(explicit.items())) if explicit else None,
        newlines_in_values=False,
        unexpected_field_behavior="infer",
    )
    try:
        return pj.read_json(
            pa.BufferReader(buf),
            read_options=pj.ReadOptions(
                block_size=_BLOCK, use_threads=False
            ),  # Spark has the cores
            parse_options=parse,
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
        return None
