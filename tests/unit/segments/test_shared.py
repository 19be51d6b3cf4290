"""Range keys and the directory of shared objects (segments/shared.py)."""

from __future__ import annotations

import pytest

from segments.shared import (
    HEAD,
    SharedFormatError,
    SharedRange,
    directory,
    directory_size,
    entry_name_of,
    is_range_key,
    object_key,
    object_name,
    parse_directory,
    resolve,
    translate,
)
from segments.store import StoreError


def test_a_range_key_resolves_to_its_object_and_range() -> None:
    name = object_name(3, "a1b2c3", 42)
    assert name == "3-a1b2c3-000000000042.kfm"
    key = "ns/deep/er/orders.eu/7/" + entry_name_of(name, 120, 64)
    assert is_range_key(key)
    assert resolve(key) == (object_key("ns/deep/er", name), 120, 64)
    assert object_key("", name) == f"default/@shared/{name}"
    assert resolve("ns/orders/7/segment-00000000000000000000.kfs") is None
    assert not is_range_key("ns/orders/7/segment-00000000000000000000.kfs")


@pytest.mark.parametrize(
    ("start", "end", "want"),
    [
        (None, None, (120, 184)),
        (10, None, (130, 184)),
        (None, 5, (120, 125)),
        (10, 20, (130, 140)),
        (60, 100, (180, 184)),  # clamped to the range
        (70, 80, (184, 184)),  # past it: empty
        (-5, 3, (120, 123)),
    ],
)
def test_translate_reads_relative_to_the_range(
    start: int | None, end: int | None, want: tuple[int, int]
) -> None:
    key = "ns/t/0/~1-ab-000000000001.kfm#120+64"
    assert translate(key, start, end) == ("ns/@shared/1-ab-000000000001.kfm", *want)
    plain = "ns/t/0/segment-00000000000000000000.kfs"
    assert translate(plain, start, end) == (plain, start, end)


@pytest.mark.parametrize(
    "key",
    [
        "ns/t/0/~name",  # no range
        "ns/t/0/~name#12",  # no length
        "ns/t/0/~name#a+1",
        "ns/t/0/~name#-1+5",
        "ns/t/0/~#1+5",  # no name
        "t/~name#1+2",  # no namespace, topic and partition
    ],
)
def test_malformed_range_keys_are_refused(key: str) -> None:
    """A store error (a corrupt entry fails its read retriably, never with a traceback)."""
    with pytest.raises(StoreError, match="malformed range key"):
        resolve(key)


def test_the_directory_round_trips_with_offsets_in_the_object() -> None:
    ranges = [
        SharedRange("orders", "ab" * 16, 0, 3, 100, 0, 50),
        SharedRange("pay.eu", "cd" * 16, 9, 1, 0, 50, 70),
    ]
    head = directory(ranges)
    assert directory_size(head[: HEAD.size]) == len(head)
    got = parse_directory("n.kfm", head + b"x" * 120)
    assert [(r.topic, r.topic_id, r.partition, r.epoch, r.base, r.length) for r in got] == [
        (r.topic, r.topic_id, r.partition, r.epoch, r.base, r.length) for r in ranges
    ]
    assert [r.off for r in got] == [len(head), len(head) + 50]
    assert got[1].entry_name == entry_name_of("n.kfm", len(head) + 50, 70)


@pytest.mark.parametrize(
    "data",
    [b"", b"KFS", b"KAFS\x00\x00\x00\x02{}", directory([])[:-1], HEAD.pack(b"KFSO", 2) + b"{}"],
)
def test_a_bad_directory_is_a_format_error(data: bytes) -> None:
    with pytest.raises(SharedFormatError):
        parse_directory("n.kfm", data)
