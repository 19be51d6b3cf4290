"""The vectorized JSON path gives exactly what the exact path gives, or steps aside."""

from __future__ import annotations

import json

import pytest

from ingest_job import jsonfast
from ingest_job.jsonvals import column_name, parse_json_values

CASES: list[tuple[list[bytes | None], dict[str, str]]] = [
    ([b'{"a": 1, "b": "x", "c": true}', None, b'{"a": 2.5, "d": null}'], {}),
    ([b'{"a": 1}', b'{"a": 2}'], {"a": "double"}),
    ([b'{"when": "2026-01-01T00:00:00", "offset": 3}'], {}),  # ISO string, reserved name
    ([b'{"a": 99999999999999999999}', b'{"a": 1}'], {}),
    ([b'{"x.y": 1, "n": {"deep": [1]}}'], {}),  # nested: exact path (JSON text)
    ([b'{"a": true}', b'{"a": 1}'], {}),  # conflict: exact path
    ([b'{"a": "one"}'], {"a": "long"}),  # dead letter: exact path
    ([b"not json", b'{"a": 1}'], {}),
    ([b"[1, 2]"], {}),
    ([b'{"a":\n1}'], {}),  # spans lines
    ([b'{"a": 1, "a": 2}'], {}),
    ([b'{"a.b": 1, "a_b": 2}'], {}),
]


@pytest.mark.parametrize(("values", "known"), CASES)
def test_fast_path_equals_exact_path(
    values: list[bytes | None], known: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    offsets = list(range(len(values)))
    fast = parse_json_values(values, offsets, known)
    monkeypatch.setattr(jsonfast, "parse_fast", lambda *_a: None)
    exact = parse_json_values(values, offsets, known)
    assert (fast.rows, fast.dead, fast.conflicts) == (exact.rows, exact.dead, exact.conflicts)
    assert fast.columns == exact.columns
    got = [(n, a.type, a.to_pylist()) for n, a in fast.arrays()]
    assert got == [(n, a.type, a.to_pylist()) for n, a in exact.arrays()]


def test_fast_path_is_taken_for_flat_objects() -> None:
    values = [json.dumps({"id": i, "name": f"n{i}", "ok": i % 2 == 0}).encode() for i in range(50)]
    assert jsonfast.parse_fast(values, {}, column_name) is not None
    assert jsonfast.parse_fast([b'{"n": {"x": 1}}'], {}, column_name) is None
