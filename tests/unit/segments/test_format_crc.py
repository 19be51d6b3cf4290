"""``build_segment``'s CRCs: the footer's body CRC combined from the batches' verified
CRCs (``batch_crcs``) is the very CRC a direct pass gives, the whole object's CRC
(``BuiltSegment.crc32c``) is its bytes' CRC, and a batch whose bytes no longer match its
CRC never gets a footer that validates."""

from __future__ import annotations

import crc32c as crc_pkg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import crc32c_combine
from protocol.batch import read_header
from segments import format as fmt
from segments import writer
from segments.format import parse_footer
from segments.validate import validate_segment
from segments.writer import build_segment
from tests.unit.segments.conftest import BASE_TS, make_batch

PROPS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
LARGE = 16 << 10  # the threshold with the C combine; the tests' large batches pass it


@pytest.fixture(autouse=True)
def combine_from_16k(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same threshold whichever combine is in use (pure Python: 256 KiB, a
    performance choice), so these batches take the combined path either way."""
    monkeypatch.setattr(writer, "COMBINE_MIN", LARGE)


def batches_of(counts: list[int], value_size: int) -> list[bytearray]:
    out, offset = [], 0
    for n in counts:
        out.append(make_batch(offset, n, ts=BASE_TS + offset, value_size=value_size))
        offset += n
    return out


def stored_crcs(batches: list[bytearray]) -> list[int]:
    return [read_header(b).crc for b in batches]


def build(batches: list[bytearray], combined: bool, **kw: int) -> tuple[fmt.BuiltSegment, bytes]:
    crcs = stored_crcs(batches) if combined else None
    built = build_segment(
        0,
        [memoryview(b) for b in batches],
        BASE_TS,
        batch_crcs=crcs,
        **kw,
    )
    return built, b"".join(built.buffers)


@PROPS
@given(
    counts=st.lists(st.integers(1, 40), min_size=1, max_size=6),
    value_size=st.sampled_from([10, 300, 1500]),
    version=st.sampled_from([1, 2]),
)
def test_combined_segment_is_byte_identical(
    counts: list[int], value_size: int, version: int
) -> None:
    """Batches below and above COMBINE_MIN, both layouts: same bytes, same CRCs."""
    batches = batches_of(counts, value_size)
    direct, direct_bytes = build(batches, False, version=version)
    combined, combined_bytes = build(batches, True, version=version)
    assert combined_bytes == direct_bytes
    assert combined.crc32c == direct.crc32c == crc_pkg.crc32c(direct_bytes)
    body = direct_bytes[fmt.HEADER_SIZE : fmt.body_end(direct_bytes)]
    assert parse_footer(combined_bytes).body_crc == crc_pkg.crc32c(body)
    assert validate_segment(combined_bytes, None if version == 2 else combined.index).ok


def test_large_batches_take_the_combined_path() -> None:
    """Batches past COMBINE_MIN are not hashed: the footer CRC comes from the CRCs given
    (a batch CRC that disagrees with the bytes shows in the footer, below)."""
    batches = batches_of([30, 25, 40], 1500)
    assert all(len(b) >= writer.COMBINE_MIN for b in batches)
    built, data = build(batches, True)
    assert built.crc32c == crc_pkg.crc32c(data)
    assert validate_segment(data).ok


def test_compacted_and_empty_segments() -> None:
    batches = batches_of([30, 30], 1500)
    built, data = build(batches, True, compacted_last=100)
    assert built.crc32c == crc_pkg.crc32c(data) and validate_segment(data).ok
    empty = build_segment(0, [], BASE_TS, compacted_last=9, batch_crcs=[])
    assert empty.crc32c == crc_pkg.crc32c(b"".join(empty.buffers))


def test_bytes_changed_after_verification_never_validate() -> None:
    """A batch whose bytes changed after its CRC was verified (its stored CRC field
    intact): the direct pass would write a footer that validates over the bad bytes; the
    combined one does not, and the object's CRC is not the bytes' CRC either (so the S3
    server refuses the PUT that carries it)."""
    batches = batches_of([30, 30], 1500)
    crcs = stored_crcs(batches)
    batches[1][200] ^= 0x01  # past offset 21: covered by the batch CRC
    built = build_segment(0, [memoryview(b) for b in batches], BASE_TS, batch_crcs=crcs)
    data = b"".join(built.buffers)
    report = validate_segment(data)
    assert not report.ok and report.footer is not None
    assert report.footer.body_crc != report.body_crc  # the footer's CRC does not match
    assert built.crc32c != crc_pkg.crc32c(data)
    direct = build_segment(0, [memoryview(b) for b in batches], BASE_TS)
    assert parse_footer(b"".join(direct.buffers)).body_crc == report.body_crc  # it would


def test_a_crc_that_is_not_the_stored_one_is_refused() -> None:
    batches = batches_of([30, 30], 1500)
    crcs = stored_crcs(batches)
    crcs[0] ^= 1
    with pytest.raises(ValueError, match="stored CRC"):
        build_segment(0, [memoryview(b) for b in batches], BASE_TS, batch_crcs=crcs)
    with pytest.raises(ValueError, match="batch CRCs for"):
        build_segment(0, [memoryview(b) for b in batches], BASE_TS, batch_crcs=crcs[:1])


def test_pure_python_combination(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback without the C extension gives the same segment (every batch
    combined, whatever its size)."""
    monkeypatch.setattr(writer, "crc32c_combine", crc32c_combine.combine_python)
    monkeypatch.setattr(writer, "COMBINE_MIN", 0)
    batches = batches_of([3, 30, 1], 200)
    direct, direct_bytes = build(batches, False)
    combined, combined_bytes = build(batches, True)
    assert combined_bytes == direct_bytes and combined.crc32c == crc_pkg.crc32c(direct_bytes)
