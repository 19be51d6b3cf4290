"""The KIP-848 server-side assignors: coverage, balance, stickiness, range layout."""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from groupcoord.consumer_assignors import range_, uniform
from groupcoord.consumer_model import Assignment

A, B = uuid.UUID(int=1), uuid.UUID(int=2)


def _flat(result: dict[str, Assignment]) -> list[tuple[uuid.UUID, int]]:
    return [(t, p) for a in result.values() for t, ps in a.items() for p in ps]


def _count(a: Assignment) -> int:
    return sum(len(ps) for ps in a.values())


@settings(max_examples=200, deadline=None)
@given(
    members=st.integers(min_value=1, max_value=12),
    pa=st.integers(min_value=0, max_value=40),
    pb=st.integers(min_value=0, max_value=40),
    hetero=st.booleans(),
)
def test_uniform_covers_every_partition_once_and_balances(
    members: int, pa: int, pb: int, hetero: bool
) -> None:
    ids = [f"m{i:02d}" for i in range(members)]
    subs = {m: frozenset({A} if hetero and i % 2 else {A, B}) for i, m in enumerate(ids)}
    out = uniform(subs, {A: pa, B: pb}, {})
    flat = _flat(out)
    assert len(flat) == len(set(flat)) == pa + pb
    for m, a in out.items():
        assert set(a) <= subs[m]
    if not hetero:
        loads = [_count(out[m]) for m in ids]
        assert max(loads) - min(loads) <= 1


def test_uniform_is_sticky_when_a_member_joins() -> None:
    subs = {"a": frozenset({A}), "b": frozenset({A})}
    first = uniform(subs, {A: 12}, {})
    subs3 = {**subs, "c": frozenset({A})}
    second = uniform(subs3, {A: 12}, first)
    assert [_count(second[m]) for m in "abc"] == [4, 4, 4]
    for m in "ab":  # nobody swaps partitions: each keeps 4 of its 6
        assert second[m][A] <= first[m][A]


def test_uniform_drops_unsubscribed_and_vanished_partitions() -> None:
    prev = {"a": {A: frozenset({0, 1, 9})}, "b": {B: frozenset({0})}}
    out = uniform({"a": frozenset({A}), "b": frozenset({A})}, {A: 4}, prev)
    assert sorted(_flat(out)) == [(A, p) for p in range(4)]
    assert out["a"][A] >= {0, 1}


def test_range_gives_contiguous_ranges_per_topic() -> None:
    out = range_({"m1": frozenset({A, B}), "m2": frozenset({A, B})}, {A: 5, B: 2}, {})
    assert out["m1"] == {A: frozenset({0, 1, 2}), B: frozenset({0})}
    assert out["m2"] == {A: frozenset({3, 4}), B: frozenset({1})}
    only = range_({"m1": frozenset({A}), "m2": frozenset({A, B})}, {A: 2, B: 3}, {})
    assert only["m2"][B] == frozenset({0, 1, 2})
