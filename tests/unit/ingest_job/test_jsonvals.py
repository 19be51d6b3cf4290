from __future__ import annotations

import json

import pyarrow as pa

from ingest_job.jsonvals import (
    coerce,
    column_name,
    kind_of,
    merge_kinds,
    parse_json_array,
    parse_json_values,
)


def _vals(*objs: object) -> list[bytes | None]:
    return [None if o is None else json.dumps(o).encode() for o in objs]


def test_new_fields_are_inferred_as_nullable_columns() -> None:
    vals = _vals({"a": 1, "s": "x"}, {"a": 2, "b": True}, {"n": {"deep": [1]}}, None)
    js = parse_json_values(vals, [10, 11, 12, 13], {})
    assert js.rows == [0, 1, 2, 3] and js.dead == [] and js.conflicts == []
    assert js.columns["a"] == ("long", [1, 2, None, None])
    assert js.columns["b"] == ("boolean", [None, True, None, None])
    assert js.columns["s"] == ("string", ["x", None, None, None])
    assert js.columns["n"] == ("string", [None, None, '{"deep":[1]}', None])


def test_long_and_double_widen_to_double() -> None:
    js = parse_json_values(_vals({"x": 1}, {"x": 2.5}), [0, 1], {})
    assert js.columns["x"] == ("double", [1.0, 2.5]) and not js.conflicts


def test_incompatible_new_field_becomes_string_and_is_reported() -> None:
    js = parse_json_values(_vals({"x": 1}, {"x": "one"}), [0, 1], {})
    assert js.columns["x"] == ("string", ["1", "one"])
    assert len(js.conflicts) == 1 and "'x'" in js.conflicts[0]


def test_known_type_conflict_goes_to_dead_letters_with_offset() -> None:
    js = parse_json_values(_vals({"x": 1}, {"x": "one"}, {"x": 3}), [5, 6, 7], {"x": "long"})
    assert js.rows == [0, 2]
    assert js.columns["x"] == ("long", [1, 3])
    assert len(js.dead) == 1 and js.dead[0][0] == 1
    assert "offset 6" in js.dead[0][1] and "type conflict" in js.dead[0][1]


def test_invalid_json_and_non_objects_are_dead_letters() -> None:
    vals: list[bytes | None] = [b"{not json", b"[1,2]", b'{"ok": 1}', b"\xff\xfe"]
    js = parse_json_values(vals, [1, 2, 3, 4], {})
    assert js.rows == [2]
    reasons = dict(js.dead)
    assert "offset 1: invalid JSON" in reasons[0]
    assert "not an object" in reasons[1]
    assert "offset 4" in reasons[3]


def test_names_clashing_with_kafka_columns_are_prefixed() -> None:
    js = parse_json_values(_vals({"offset": 3, "a.b": 1}), [0], {})
    assert set(js.columns) == {"value_offset", "a_b"}
    assert column_name("topic") == "value_topic" and column_name("plain") == "plain"


def test_kinds_and_coercion_rules() -> None:
    assert kind_of(True) == "boolean" and kind_of(3) == "long" and kind_of(2**70) == "double"
    assert kind_of(None) is None and kind_of([1]) == "string"
    assert merge_kinds({"long"}) == ("long", False)
    assert merge_kinds({"boolean", "long"}) == ("string", True)
    assert coerce(True, "long") == (True, False)
    assert coerce(3, "double") == (3.0, True)
    assert coerce({"a": 1}, "string") == ('{"a":1}', True)
    assert coerce(None, "boolean") == (None, True)


def test_lone_surrogates_are_dead_letters_not_failures() -> None:
    """Unpaired surrogate escapes (in a value or a key; or CESU-8 bytes, which the
    standard parser reads as one) have no UTF-8 form: that record is a dead letter."""
    vals: list[bytes | None] = [
        b'{"s": "ok", "n": 1}',
        b'{"s": "x\\ud800", "n": 2}',
        b'{"\\udfff": 1}',
        b'{"s": "\xed\xa0\x80"}',
        b'{"s": "\\ud83d\\ude00", "o": {"t": "\\ud800"}}',
    ]
    for js in (
        parse_json_values(vals, [10, 11, 12, 13, 14], {}),
        parse_json_array(pa.array(vals, pa.binary()), pa.array([10, 11, 12, 13, 14]), {}),
    ):
        assert js.rows == [0, 4]
        assert [i for i, _ in js.dead] == [1, 2, 3]
        assert all("surrogate" in reason for _, reason in js.dead)
        assert "offset 11" in js.dead[0][1]
        arrays = dict(js.arrays())
        assert arrays["s"].to_pylist() == ["ok", "\U0001f600"]
        assert arrays["o"].to_pylist() == [None, '{"t":"\\ud800"}']
