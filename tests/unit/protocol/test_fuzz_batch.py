"""Fuzzing: random and mutated bytes may only raise the protocol's own errors, never crash
with anything else and never hang."""

from __future__ import annotations

import random
import struct
import zlib
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.batch import (
    BATCH_HEADER_SIZE,
    CorruptBatchError,
    crc32c,
    iter_batches,
    read_header,
    verify_crc,
)
from protocol.compression import Compression, compress
from protocol.errors import KafkaProtocolError
from protocol.legacy import convert_message_set
from protocol.records import build_batch, decode_batch, decode_batch_columns, offset_for_timestamp

ALLOWED = (KafkaProtocolError, CorruptBatchError)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


def _records(i: int) -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]]:
    return [
        (
            b"key-%d" % j if j % 3 else None,
            b"v" * (j * 37 % 400) if j % 4 else None,
            [(f"h{j}", b"x" * j), ("n", None)] if j % 2 else [],
        )
        for j in range(i + 1)
    ]


SEEDS = [
    build_batch(
        _records(i),
        base_offset=i * 10,
        compression=codec,
        timestamps=[1000 + 13 * j - 50 * (j % 2) for j in range(i + 1)],
    )
    for i, codec in enumerate([*Compression, *Compression])
]


def _legacy_message(magic: int, key: bytes | None, value: bytes | None, attrs: int = 0) -> bytes:
    body = struct.pack(">bb", magic, attrs) + (struct.pack(">q", 5) if magic else b"")
    for field in (key, value):
        body += struct.pack(">i", -1) if field is None else struct.pack(">i", len(field)) + field
    msg = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", 0, len(msg)) + msg


_INNER = _legacy_message(1, b"a", b"1") + _legacy_message(1, None, b"22")
LEGACY_SEEDS = [
    _INNER + _legacy_message(0, b"k", None),
    _legacy_message(1, None, compress(Compression.GZIP, _INNER), attrs=1),
    _legacy_message(1, None, compress(Compression.SNAPPY, _INNER), attrs=2),
    _legacy_message(0, None, compress(Compression.LZ4, _INNER), attrs=3),
]


def _exercise(data: bytes) -> None:
    """Run every entry point; only protocol errors may escape."""
    calls: list[Callable[[], object]] = [
        lambda: list(iter_batches(memoryview(data))),
        lambda: verify_crc(data),
        lambda: decode_batch(data),
        lambda: decode_batch(memoryview(data), check_crc=True),
        lambda: decode_batch_columns(data),
        lambda: offset_for_timestamp(data, 1010),
        lambda: convert_message_set(memoryview(data)),
    ]
    for call in calls:
        try:
            call()
        except ALLOWED:
            pass


def _fix_crc(raw: bytearray) -> bytearray:
    if len(raw) >= BATCH_HEADER_SIZE:
        struct.pack_into(">I", raw, 17, crc32c(memoryview(raw)[21:]))
    return raw


def _mutate(rng: random.Random, data: bytes) -> bytes:
    raw = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(5)
        if not raw:
            raw += rng.randbytes(rng.randint(1, 80))
        elif op == 0:  # flip bits
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        elif op == 1:  # truncate
            del raw[rng.randrange(len(raw)) :]
        elif op == 2:  # insert junk
            pos = rng.randrange(len(raw) + 1)
            raw[pos:pos] = rng.randbytes(rng.randint(1, 16))
        elif op == 3:  # interesting 32-bit value at a random place
            pos = rng.randrange(len(raw))
            value = rng.choice([0, -1, 1, 0x7FFFFFFF, -0x80000000, 61, len(raw)])
            raw[pos : pos + 4] = struct.pack(">i", value)
        else:  # interesting single byte (varint continuation, zigzag -1, magic)
            raw[rng.randrange(len(raw))] = rng.choice([0x00, 0x01, 0x02, 0x7F, 0x80, 0xFF])
    if rng.random() < 0.5:
        _fix_crc(raw)  # get past the CRC check into the record parser
    return bytes(raw)


@FUZZ
@given(st.binary(max_size=400))
def test_random_bytes(data: bytes) -> None:
    _exercise(data)


@FUZZ
@given(
    seed=st.sampled_from(SEEDS + LEGACY_SEEDS),
    rnd=st.randoms(use_true_random=False),
)
def test_mutated_batches(seed: bytes, rnd: random.Random) -> None:
    _exercise(_mutate(rnd, seed))


@FUZZ
@given(
    body=st.binary(max_size=200),
    count=st.integers(-2, 2**31 - 1),
    codec=st.sampled_from(list(Compression)),
    attrs_extra=st.sampled_from([0, 0x08, 0x10, 0x20]),
)
def test_structured_headers_with_random_records(
    body: bytes, count: int, codec: Compression, attrs_extra: int
) -> None:
    """A valid header (and valid compression) around arbitrary record bytes."""
    payload = compress(codec, body)
    raw = bytearray(SEEDS[0][:BATCH_HEADER_SIZE]) + payload
    struct.pack_into(">i", raw, 8, len(raw) - 12)
    struct.pack_into(">h", raw, 21, int(codec) | attrs_extra)
    struct.pack_into(">i", raw, 57, count)
    _exercise(bytes(_fix_crc(raw)))


@pytest.mark.timeout(60)
def test_many_deterministic_mutations() -> None:
    rng = random.Random(20261122)
    seeds = SEEDS + LEGACY_SEEDS
    for _ in range(3000):
        _exercise(_mutate(rng, rng.choice(seeds)))
    # the seeds themselves still decode (the harness is not vacuous)
    for s in SEEDS:
        hdr, recs = decode_batch(s, check_crc=True)
        assert len(recs) == hdr.record_count == read_header(s).record_count
    for s in LEGACY_SEEDS:
        assert list(iter_batches(memoryview(convert_message_set(s))))


def test_seed_mutations_are_detected_by_crc() -> None:
    rng = random.Random(7)
    for s in SEEDS:
        raw = bytearray(s)
        raw[rng.randrange(21, len(raw))] ^= 0x10
        assert not verify_crc(raw)
        with pytest.raises(KafkaProtocolError):
            decode_batch(raw, check_crc=True)
