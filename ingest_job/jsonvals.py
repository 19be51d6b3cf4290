"""JSON record values -> typed Arrow columns, with schema inference and dead letters.

Top-level fields of a JSON object become nullable columns. Types: ``long`` (integers),
``double`` (numbers; integers widen to it), ``boolean``, ``string`` (strings; nested
objects and arrays are kept as their JSON text). A field the table already has keeps its
type: a value that does not fit it is a *type conflict* and its record goes to the
dead-letter table with the reason. A new field seen with incompatible types in one run
becomes ``string`` and the conflict is reported. Values that are not JSON objects go to
the dead-letter table; a null value (tombstone) is a row with every JSON column null.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from ingest_job.decode import RAW_SCHEMA

ARROW_TYPES: dict[str, pa.DataType] = {
    "long": pa.int64(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "string": pa.string(),
}
_RESERVED = frozenset(RAW_SCHEMA.names)
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1


@functools.lru_cache(maxsize=4096)
def column_name(field_name: str) -> str:
    """The table column for a JSON field (names clashing with Kafka columns get ``value_``)."""
    name = field_name.replace(".", "_")
    return f"value_{name}" if name in _RESERVED else name


def kind_of(value: object) -> str | None:
    """The type name a JSON value infers (None for null)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "long" if _LONG_MIN <= value <= _LONG_MAX else "double"
    if isinstance(value, float):
        return "double"
    return "string"


def merge_kinds(kinds: set[str]) -> tuple[str, bool]:
    """(resulting type, conflict?) for the kinds one new field was seen with."""
    if len(kinds) == 1:
        return next(iter(kinds)), False
    if kinds <= {"long", "double"}:
        return "double", False
    return "string", True


def coerce(value: object, kind: str) -> tuple[object, bool]:
    """(value as ``kind``, ok?) — ``ok`` is False when the value does not fit."""
    if value is None:
        return None, True
    if kind == "string":
        if isinstance(value, str):
            return value, True
        return json.dumps(value, separators=(",", ":")), True
    if kind == "boolean":
        return value, isinstance(value, bool)
    if isinstance(value, bool):
        return value, False
    if kind == "long":
        return value, isinstance(value, int) and _LONG_MIN <= value <= _LONG_MAX
    if kind == "double":
        return (float(value), True) if isinstance(value, int | float) else (value, False)
    return value, False


@dataclass(slots=True)
class JsonColumns:
    """The parse of one batch of values."""

    # indices of rows that parsed (a range when all did: no Python int per row)
    rows: list[int] | range = field(default_factory=list)
    # name -> (kind, values); the values are empty when ``arrow`` holds the columns
    # (parse_json_array's fast path builds no Python values)
    columns: dict[str, tuple[str, list[object]]] = field(default_factory=dict)
    dead: list[tuple[int, str]] = field(default_factory=list)  # (row index, reason)
    conflicts: list[str] = field(default_factory=list)
    # set by the vectorized path (ingest_job/jsonfast.py): the columns as Arrow arrays
    arrow: dict[str, pa.Array] | None = None

    def kinds(self) -> dict[str, str]:
        """Column name -> kind (long, double, boolean, string)."""
        return {name: kind for name, (kind, _v) in self.columns.items()}

    def arrays(self) -> list[tuple[str, pa.Array]]:
        if self.arrow is not None:
            return sorted(self.arrow.items())
        return [
            (name, pa.array(vals, ARROW_TYPES[kind]))
            for name, (kind, vals) in sorted(self.columns.items())
        ]


def _parse(
    values: Sequence[bytes | None], offsets: Sequence[int]
) -> tuple[list[tuple[int, dict[str, object]]], list[tuple[int, str]]]:
    parsed: list[tuple[int, dict[str, object]]] = []
    dead: list[tuple[int, str]] = []
    for i, raw in enumerate(values):
        if raw is None:
            parsed.append((i, {}))
            continue
        try:
            obj = _loads(raw)
        except ValueError:
            try:  # orjson is stricter (NaN, lone surrogates): the standard parser decides
                obj = _std_loads(raw)
            except (ValueError, UnicodeDecodeError) as exc:
                dead.append((i, f"offset {offsets[i]}: invalid JSON: {exc}"))
                continue
        if not isinstance(obj, dict):
            dead.append((i, f"offset {offsets[i]}: JSON value is not an object"))
            continue
        parsed.append((i, {column_name(k): v for k, v in obj.items()}))
    return parsed, dead


def _utf8(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _std_loads(raw: bytes) -> object:
    """The standard parser, refusing a top-level key or string value holding a lone
    surrogate (an unpaired ``\\ud800`` escape, or its CESU-8 bytes, which ``json.loads``
    reads too): it has no UTF-8 form, so no Arrow string column can hold it. Nested
    values are kept as JSON text, where ``json.dumps`` escapes it again."""
    obj = json.loads(raw)
    if isinstance(obj, dict):
        for key, val in obj.items():
            if not _utf8(key) or (isinstance(val, str) and not _utf8(val)):
                raise ValueError("lone surrogate in a string (no UTF-8 form)")
    return obj


def _fast_loads() -> Callable[[bytes], object]:
    """orjson's parser when installed (several times faster), else the standard one."""
    try:
        import orjson
    except ImportError:
        return _std_loads
    return orjson.loads


_loads = _fast_loads()
_EXACT = {"long": int, "double": float, "boolean": bool, "string": str}


def _flat_kinds(
    flat: list[tuple[str, str, pa.Array]], known: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, pa.Array]] | None:
    """The natively parsed fields as the exact path's columns, or None where it would
    differ (two fields naming one column, a value not of its known column's kind)."""
    kinds: dict[str, str] = {}
    arrays: dict[str, pa.Array] = {}
    for field_name, kind, arr in flat:
        name = column_name(field_name)
        if name in arrays:
            return None
        want = known.get(name, kind)
        if want != kind and not (want == "double" and kind == "long"):
            return None  # conflicts and dead letters: the exact path decides
        kinds[name] = want
        # a long in a double column past 2**53: rounded to the nearest double, as the
        # exact path's float() does (a safe cast refuses it)
        arrays[name] = arr.cast(ARROW_TYPES[want], safe=want == kind)
    return kinds, arrays


def parse_json_array(
    values: pa.Array | pa.ChunkedArray,
    offsets: pa.Array | pa.ChunkedArray,
    known: Mapping[str, str],
) -> JsonColumns:
    """:func:`parse_json_values` over Arrow columns, without a Python object per value
    where that cannot differ: flat objects parsed natively straight into Arrow arrays
    (``ingest_job/columnar.py``), else the values joined into lines for pyarrow's JSON
    reader (``ingest_job/jsonfast.py``); else the exact path runs."""
    from ingest_job.columnar import json_flat_columns, json_lines
    from ingest_job.jsonfast import parse_lines

    flat = json_flat_columns(values) if len(values) else None
    fast = _flat_kinds(flat, known) if flat is not None else None
    if fast is None:
        buf = json_lines(values) if len(values) else None
        fast = parse_lines(buf, len(values), known, column_name) if buf is not None else None
    if fast is None:
        return parse_json_values(values.to_pylist(), offsets.to_pylist(), known)
    kinds, arrow = fast
    return JsonColumns(
        rows=range(len(values)),
        columns={n: (kind, []) for n, kind in kinds.items()},
        arrow=arrow,
    )


def parse_json_values(
    values: Sequence[bytes | None], offsets: Sequence[int], known: Mapping[str, str]
) -> JsonColumns:
    """Parse ``values``; ``known`` maps existing table columns to their types."""
    from ingest_job.jsonfast import parse_fast

    fast = parse_fast(values, known, column_name)
    if fast is not None:
        fast_kinds, arrow = fast
        return JsonColumns(
            rows=list(range(len(values))),
            columns={n: (kind, arrow[n].to_pylist()) for n, kind in fast_kinds.items()},
            arrow=arrow,
        )
    parsed, dead = _parse(values, offsets)
    seen: dict[str, set[str]] = {}
    for _i, obj in parsed:
        for name, val in obj.items():
            k = kind_of(val)
            if k is not None:
                seen.setdefault(name, set()).add(k)
    out = JsonColumns(dead=dead)
    kinds: dict[str, str] = {}
    for name, ks in sorted(seen.items()):
        if name in known:
            kinds[name] = known[name]
            continue
        kinds[name], conflict = merge_kinds(ks)
        if conflict:
            out.conflicts.append(
                f"field {name!r} seen as {', '.join(sorted(ks))}: stored as string"
            )
    cols: dict[str, list[object]] = {name: [] for name in kinds}
    kept: list[int] = []
    for i, obj in parsed:
        row: dict[str, object] = {}
        bad = None
        for name, val in obj.items():
            kind = kinds.get(name)
            if kind is None:
                continue  # only ever null
            if type(val) is _EXACT[kind] and (kind != "long" or _LONG_MIN <= val <= _LONG_MAX):  # type: ignore[operator]
                row[name] = val  # the common case, without a call
                continue
            row[name], ok = coerce(val, kind)
            if not ok:
                bad = (
                    f"offset {offsets[i]}: type conflict: field {name!r} is {kind} "
                    f"in the table, got {kind_of(val)}"
                )
                break
        if bad is not None:
            out.dead.append((i, bad))
            continue
        kept.append(i)
        for name, vals in cols.items():
            vals.append(row.get(name))
    out.rows = kept
    out.dead.sort()
    out.columns = {name: (kinds[name], vals) for name, vals in cols.items()}
    return out
