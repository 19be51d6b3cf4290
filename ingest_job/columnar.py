"""Column-at-a-time steps of the ingest task, native when ``ingest_job._columnar`` is built.

- :func:`json_flat_columns`: a unit's JSON values, when every one is an object of flat
  fields (numbers, strings, booleans, null), parsed straight from the Arrow value column
  into one Arrow array per field (``ingest_job/jsonvals.py`` decides when it applies).
- :func:`json_lines`: the values joined into one newline-delimited buffer for pyarrow's
  JSON reader (``ingest_job/jsonfast.py``), the next fast path.
- :func:`avro_flat_columns`: Confluent-wire Avro values of one *flat* record schema
  (fields of primitive types or ``["null", T]``) decoded into Arrow arrays in one pass,
  without a Python object per value (``ingest_job/typed_fast.py`` decides when).

Both step aside (return None) rather than differ from the value-by-value paths. The C
extension (``setup.py``) is optional: without it, or with ``KAFSCALE_PURE_PYTHON=1``,
:func:`json_lines` joins in Python and the others return None, so pyarrow's JSON reader
or the per-record decoders run. docs/ingest.md, "Performance".
"""

from __future__ import annotations

import pyarrow as pa

from protocol.native import load_native

native = load_native("ingest_job._columnar")
#: "c" when the native helpers are in use, else "python"
IMPLEMENTATION = "c" if native is not None else "python"

#: Avro primitive -> (field code, Arrow type of the decoded column)
AVRO_CODES: dict[str, tuple[str, pa.DataType]] = {
    "boolean": ("b", pa.bool_()),
    "int": ("i", pa.int32()),
    "long": ("l", pa.int64()),
    "float": ("f", pa.float32()),
    "double": ("d", pa.float64()),
    "string": ("s", pa.large_string()),
    "bytes": ("y", pa.large_binary()),
}


def _chunks(values: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    return [c for c in chunks if len(c)]


def _binary_args(arr: pa.Array) -> tuple[pa.Buffer | None, pa.Buffer, pa.Buffer | bytes, int, int]:
    """(validity, int32 offsets, data, length, array offset) of a binary array."""
    if arr.type != pa.binary():
        arr = arr.cast(pa.binary())
    validity, offsets, data = arr.buffers()
    if arr.null_count == 0:
        validity = None
    return validity, offsets, data if data is not None else b"", len(arr), arr.offset


def json_lines(values: pa.Array | pa.ChunkedArray) -> bytes | None:
    """The values joined by ``\\n`` (a null as ``{}``); None when a value spans lines."""
    chunks = _chunks(values)
    if native is None:
        items = [b"{}" if v is None else v for c in chunks for v in c.to_pylist()]
        buf = b"\n".join(items)
        if buf.count(b"\n") != max(len(items) - 1, 0) or b"\r" in buf:
            return None
        return buf
    parts = [native.join_lines(*_binary_args(c)) for c in chunks]
    if any(p is None for p in parts):
        return None
    return parts[0] if len(parts) == 1 else b"\n".join(parts)


def _array(kind: pa.DataType, n: int, field: tuple[object, ...]) -> pa.Array:
    buf = pa.py_buffer
    validity, nulls = field[0], int(field[1])  # type: ignore[call-overload]
    bitmap = buf(validity) if validity is not None else None
    rest = [buf(b) for b in field[2:]]
    return pa.Array.from_buffers(kind, n, [bitmap, *rest], null_count=nulls)


def avro_flat_columns(
    values: pa.Array | pa.ChunkedArray, header: bytes, fields: list[tuple[str, pa.DataType]]
) -> list[pa.Array] | None:
    """One array per field (``fields``: (code, Arrow type) from :data:`AVRO_CODES`) of
    every value, or None (no native helper, or a value this path does not decode)."""
    if native is None:
        return None
    codes = "".join(code for code, _t in fields).encode()
    per_chunk: list[list[pa.Array]] = []
    for chunk in _chunks(values):
        out = native.avro_flat(*_binary_args(chunk), header, codes)
        if out is None:
            return None
        per_chunk.append([_array(t, len(chunk), f) for (_c, t), f in zip(fields, out, strict=True)])
    if not per_chunk:
        return None
    if len(per_chunk) == 1:
        return per_chunk[0]
    return [pa.concat_arrays([c[i] for c in per_chunk]) for i in range(len(fields))]


_JSON_TYPES = {
    "long": pa.int64(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "string": pa.large_string(),
}


def json_flat_columns(
    values: pa.Array | pa.ChunkedArray,
) -> list[tuple[str, str, pa.Array]] | None:
    """(field, kind, array) per field holding a value, in order of first appearance; None
    when a value is not a flat JSON object (nested, malformed, an escaped key, a
    duplicate key, an integer past 64 bits, ...) or a field mixes kinds other than long
    and double (longs then widen to doubles)."""
    if native is None:
        return None
    chunks = _chunks(values)
    if not chunks:
        return None
    try:
        chunk = chunks[0] if len(chunks) == 1 else pa.concat_arrays(chunks)
    except (pa.ArrowInvalid, pa.ArrowCapacityError):
        return None
    out = native.json_flat(*_binary_args(chunk))
    if out is None:
        return None
    n = len(chunk)
    return [
        (name.decode("utf-8"), kind, _array(_JSON_TYPES[kind], n, rest))
        for name, kind, *parts in out
        for rest in [tuple(parts)]
    ]
