"""A columnar fast path for Avro values (``--value-format avro``): a whole unit's values
decoded at once by :func:`ingest_job.columnar.avro_flat_columns` when they cannot decode
differently value by value (``ingest_job/typed.py``'s :func:`decode_values`).

Taken only when every value is non-null and carries the same schema id, that schema is
a record whose fields are primitives (boolean, int, long, float, double, string, bytes,
no logical type) or ``["null", T]`` / ``[T, "null"]`` of one, no field needs renaming
away from the Kafka columns, and each field's column has the decoded type (or a
widening of it: int -> long, float -> double). Anything else, including any value the
native decoder does not accept (truncated, trailing bytes, invalid UTF-8, an int past 32
bits), returns None and the exact path runs, with its dead letters. docs/ingest.md.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import pyarrow as pa

from ingest_job.columnar import AVRO_CODES, avro_flat_columns, native
from ingest_job.typed_schema import top_name

_WIDER = {(pa.int32(), pa.int64()), (pa.float32(), pa.float64())}
_SAME = {
    (pa.large_string(), pa.string()),
    (pa.large_binary(), pa.binary()),
}


def _field_code(avro: Any) -> tuple[str, pa.DataType] | None:
    """(code, Arrow type) of a flat field's Avro type, or None."""
    if isinstance(avro, dict):
        if "logicalType" in avro or not isinstance(avro.get("type"), str):
            return None
        avro = avro["type"]
    if isinstance(avro, str):
        return AVRO_CODES.get(avro)
    if isinstance(avro, list) and len(avro) == 2 and "null" in avro:
        other = avro[1] if avro[0] == "null" else avro[0]
        inner = _field_code(other) if other != "null" else None
        if inner is None:
            return None
        code, kind = inner
        return code.upper() + ("" if avro[0] == "null" else "~"), kind
    return None


@functools.lru_cache(maxsize=256)
def flat_plan(schema_text: str) -> tuple[tuple[str, str, pa.DataType], ...] | None:
    """(column, code, Arrow type) per field of a flat record schema, or None."""
    try:
        doc = json.loads(schema_text)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("type") != "record":
        return None
    out = []
    for f in doc.get("fields", []):
        name = f.get("name")
        got = _field_code(f.get("type"))
        if not isinstance(name, str) or got is None or top_name(name) != name:
            return None
        out.append((name, *got))
    return tuple(out) if out else None


def _fit(arr: pa.Array, want: pa.DataType) -> pa.Array | None:
    if arr.type == want:
        return arr
    if (arr.type, want) in _WIDER or (arr.type, want) in _SAME:
        return arr.cast(want)
    return None


def avro_fast(
    entries: dict[int, Any], columns: pa.Schema, values: pa.Array | pa.ChunkedArray
) -> pa.StructArray | None:
    """The value columns (one struct array, ``columns``' fields) of every value, or None.

    ``entries``: schema id -> registry entry (``ingest_job.typed.RegistryEntry``).
    """
    if native is None or len(values) == 0 or values.null_count:
        return None
    head = values[0].as_py()  # (a ChunkedArray finds its first non-empty chunk)
    if not isinstance(head, bytes) or len(head) < 5 or head[0] != 0:
        return None
    entry = entries.get(int.from_bytes(head[1:5], "big"))
    if entry is None or entry.schema.schema_type != "AVRO" or entry.refs:
        return None
    plan = flat_plan(entry.schema.schema)
    if plan is None:
        return None
    arrays = avro_flat_columns(values, head[:5], [(code, kind) for _n, code, kind in plan])
    if arrays is None:
        return None
    by_name = dict(zip((n for n, _c, _k in plan), arrays, strict=True))
    out: list[pa.Array] = []
    for field in columns:
        arr = by_name.pop(field.name, None)
        if arr is None:
            out.append(pa.nulls(len(values), field.type))
            continue
        fitted = _fit(arr, field.type)
        if fitted is None:
            return None
        out.append(fitted)
    if by_name:  # a field without a column: the exact path reports it
        return None
    return pa.StructArray.from_arrays(out, fields=list(columns))
